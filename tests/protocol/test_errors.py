"""The error tree: unique wire codes, and code -> class -> code round trips."""

from __future__ import annotations

import pytest

from fabric import errors as E


def all_error_classes() -> list[type[E.FabricError]]:
    out: list[type[E.FabricError]] = []
    todo = [E.FabricError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__ == E.__name__:  # ignore subclasses other test modules may define
                out.append(sub)
                todo.append(sub)
    return out


CLASSES = all_error_classes()


def test_codes_and_names_are_unique() -> None:
    codes = [cls.code for cls in CLASSES]
    names = [cls.name for cls in CLASSES]
    assert len(set(codes)) == len(codes), sorted(codes)
    assert len(set(names)) == len(names), sorted(names)


def test_every_code_fits_the_status_field_and_zero_means_ok() -> None:
    assert all(0 < cls.code <= 0xFFFF for cls in CLASSES)


def test_all_codes_lists_every_class() -> None:
    assert E.all_codes() == {cls.code: cls.name for cls in sorted(CLASSES, key=lambda c: c.code)}
    assert list(E.all_codes()) == sorted(E.all_codes())


def test_every_class_defines_its_own_code_and_name() -> None:
    for cls in CLASSES:
        assert "code" in vars(cls) and "name" in vars(cls), cls
        assert cls.name.isupper() and cls.name.replace("_", "").isalpha()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_error_for_code_round_trip(cls: type[E.FabricError]) -> None:
    err = E.error_for_code(cls.code, "details here")
    assert type(err) is cls
    assert err.message == "details here" and str(err) == "details here"
    assert err.code == cls.code and err.name == cls.name and err.retriable == cls.retriable
    assert type(E.error_for_code(cls.code)) is cls


@pytest.mark.parametrize("code", [0, 17, 18, 29, 49, 51, 999, -1, 0xFFFF])
def test_unknown_code_is_internal_error(code: int) -> None:
    err = E.error_for_code(code, "boom")
    assert type(err) is E.InternalError
    assert str(code) in err.message and "boom" in err.message


def test_default_message_is_the_name() -> None:
    assert E.QueueFull().message == "QUEUE_FULL" == str(E.QueueFull())


def test_tree_shape() -> None:
    for cls in (E.UnsupportedVersion, E.UnknownCommand, E.RequestTooLarge, E.CorruptBatch):
        assert issubclass(cls, E.ProtocolError)
    assert issubclass(E.DiskFull, E.StorageError)
    assert not issubclass(E.BadParameter, E.ProtocolError)
    assert not issubclass(E.MessageTooLarge, E.ProtocolError)
    assert all(issubclass(cls, E.FabricError) for cls in CLASSES)


def test_retriable_errors() -> None:
    retriable = {cls.name for cls in CLASSES if cls.retriable}
    assert retriable == {
        "QUEUE_FULL",
        "NOT_LEADER",
        "TIMEOUT",
        "DISK_FULL",
        "SHUTTING_DOWN",
        "CONNECTION_FAILED",
        "UNKNOWN_MEMBER",
        "FENCED_LEADER_EPOCH",
        "NOT_ENOUGH_REPLICAS",
        "METADATA_UNAVAILABLE",
        "CLUSTER_UNAVAILABLE",
        "NOT_COORDINATOR",
        "THROTTLED",
        "QUEUE_MOVED",
        "PARTITION_RETIRED",
    }
