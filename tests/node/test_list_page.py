"""LIST_QUEUES' paging (pure): which names a page holds and where the next one starts, by name,
prefix, count and bytes."""

from __future__ import annotations

from fabric.node.admin import LIST_ENTRY_BYTES, LIST_PAGE_BYTES, list_page

NAMES = sorted(["a", "b", "b.1", "b.2", "b.3", "ba", "c", "d.x", "d.y", "e"])


def _walk(names: list[str], prefix: str | None, limit: int, budget: int = LIST_PAGE_BYTES) -> list[list[str]]:
    pages, start = [], None
    while True:
        page, start = list_page(names, start, prefix, limit, budget)
        pages.append(page)
        if start is None:
            return pages


def test_pages_join_up_without_a_gap_or_a_repeat() -> None:
    for limit in range(1, len(NAMES) + 2):
        pages = _walk(NAMES, None, limit)
        assert [n for p in pages for n in p] == NAMES, limit
        assert all(len(p) == limit for p in pages[:-1]) and 0 < len(pages[-1]) <= limit
    assert list_page(NAMES, None, None, 3) == (["a", "b", "b.1"], "b.2")
    assert list_page(NAMES, "b.2", None, 3) == (["b.2", "b.3", "ba"], "c")
    assert list_page(NAMES, None, None, len(NAMES)) == (NAMES, None)  # exactly full: the last page


def test_from_is_a_position_not_a_name_that_must_exist() -> None:
    assert list_page(NAMES, "b.15", None, 2) == (["b.2", "b.3"], "ba")
    assert list_page(NAMES, "e", None, 5) == (["e"], None)
    assert list_page(NAMES, "f", None, 5) == ([], None)  # past the end
    assert list_page([], None, None, 5) == ([], None)


def test_a_prefix_lists_its_names_only() -> None:
    assert list_page(NAMES, None, "b.", 10) == (["b.1", "b.2", "b.3"], None)
    assert [n for p in _walk(NAMES, "b", 1) for n in p] == ["b", "b.1", "b.2", "b.3", "ba"]
    assert list_page(NAMES, None, "d.", 1) == (["d.x"], "d.y")
    assert list_page(NAMES, "d.y", "d.", 1) == (["d.y"], None)  # "e" follows but is not the prefix's
    assert list_page(NAMES, "a", "c", 5) == (["c"], None)  # from before the prefix: the prefix's first
    assert list_page(NAMES, "z", "c", 5) == ([], None)
    assert list_page(NAMES, None, "nothing", 5) == ([], None)
    assert list_page(NAMES, None, "", 100) == (NAMES, None)


def test_the_byte_budget_ends_a_page_of_long_names_before_the_limit() -> None:
    names = [f"{i:03d}" + "x" * 197 for i in range(100)]
    per = 200 + LIST_ENTRY_BYTES
    page, after = list_page(names, None, None, 5000, budget=10 * per)
    assert page == names[:10] and after == names[10]
    assert [n for p in _walk(names, None, 5000, budget=10 * per + 1) for n in p] == names
    assert list_page(names, None, None, 5000, budget=per - 1) == ([names[0]], names[1])  # a walk always ends
