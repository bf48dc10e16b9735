"""Rate limits (issue 12, item 4) on a real node: a producer over its queue's quota is slowed to
it (throttle_ms in the replies, the client waits), nothing is lost, and another tenant's
requests keep flowing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fabric.client import Admin, Producer
from fabric.errors import BadParameter, ConfigError
from fabric.settings import load_config

pytestmark = pytest.mark.integration


def test_a_flooding_producer_is_held_to_its_quota_and_loses_nothing(node) -> None:
    quota = 2000
    with Admin(node.endpoint) as admin:
        admin.create_queue("flood", fsync="interval")
        admin.create_queue("calm", fsync="interval")
        admin.quota_set("queue:flood", messages_per_s=quota)
        with pytest.raises(BadParameter, match="quota target"):
            admin.quota_set("flood", messages_per_s=1)
    total = 8000
    acked: list[float] = []
    calm_lat: list[float] = []
    done = threading.Event()

    def calm() -> None:  # the other tenant: one message at a time, 100/s
        with Producer(node.endpoint, linger_ms=0) as p:
            while not done.is_set():
                t = time.monotonic()
                p.send("calm", b"c").result(10)
                calm_lat.append(time.monotonic() - t)
                time.sleep(0.01)

    other = threading.Thread(target=calm)
    other.start()
    try:
        with Producer(node.endpoint, linger_ms=5, batch_messages=100) as prod:
            t0 = time.monotonic()
            for i in range(total):  # as fast as send() goes: ~50x the quota
                prod.send(
                    "flood",
                    b"f%d" % i,
                    callback=lambda md, exc: acked.append(time.monotonic()) if exc is None else None,
                )
            prod.flush(60)
            elapsed = time.monotonic() - t0
            assert prod.throttled_ms > 0
    finally:
        done.set()
        other.join(30)
    assert len(acked) == total  # slowed, not failed: every message stored
    acked.sort()
    burst = quota  # a second's worth goes at once
    steady = (total - burst) / (acked[-1] - acked[burst - 1])
    print(
        f"flooder: {total} in {elapsed:.2f} s, steady {steady:.0f} msg/s (quota {quota}); calm p99 "
        f"{sorted(calm_lat)[int(0.99 * len(calm_lat))] * 1000:.1f} ms over {len(calm_lat)} sends"
    )
    assert 0.85 * quota <= steady <= 1.15 * quota
    assert len(calm_lat) > 50 and max(calm_lat) < 1.0  # the other queue's producer was never held up
    with Admin(node.endpoint) as admin:
        assert admin.describe_queue("flood")["messages"] == total
        listed = admin.quota_list()
        assert listed["throttled_ms"]["queue:flood"] > 0
        admin.quota_set("queue:flood")  # 0 and 0: no limit any more
        assert admin.quota_list()["quotas"] == []


def test_quotas_in_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "q.toml"
    cfg.write_text(
        '[quotas]\n"queue:orders" = { messages_per_s = 100, bytes_per_s = 1048576 }\n"principal:alice" = { bytes_per_s = 10 }\n'
    )
    config = load_config(cfg)
    assert config.quotas[0] == {"target": "queue:orders", "messages_per_s": 100, "bytes_per_s": 1048576}
    cfg.write_text('[quotas]\n"orders" = { messages_per_s = 100 }\n')
    with pytest.raises(ConfigError, match="queue:NAME"):
        load_config(cfg)
    cfg.write_text('[quotas]\n"queue:orders" = { per_s = 100 }\n')
    with pytest.raises(ConfigError, match="per_s"):
        load_config(cfg)
