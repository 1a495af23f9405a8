"""`load_version` through the C ABI: pin an older full version (rollback), then unpin."""

from __future__ import annotations

import json
import shutil

from recserve import Processor
from recserve.export import write_checkpoint
from recserve.export.demo import demo_dense, demo_tables, write_demo
from recserve.model_store.checkpoint import TableData


def test_pin_and_unpin_through_the_c_abi(client, tmp_path, make_requests) -> None:
    demo = write_demo(tmp_path / "demo")
    # Version 2: every row of every table scaled, so its predictions differ from version 1's.
    tables = {n: TableData(t.keys, t.values * 1.5) for n, t in demo_tables().items()}
    write_checkpoint(demo.checkpoint_dir, tables, global_step=2, dense=demo_dense())
    config = json.loads(demo.config_path.read_text())
    requests = make_requests(demo, 6, batch=4)
    expected = {}
    for version in ("1", "2"):
        p = Processor({**config, "pinned_version": version})
        expected[version] = [p.process(r) for r in requests]
        p.close()
    assert expected["1"] != expected["2"]

    run = client.run("pin", client.config_file("pin.json", json.dumps(config)), "1",
                     client.requests_file("pin-req", requests), client.workdir / "pin-out")
    assert run.returncode == 0, run.stderr
    pin, unpin = run.stdout.splitlines()
    assert pin.startswith("pin 200 ") and json.loads(pin[len("pin 200 "):])["pinned_version"] == "1"
    assert unpin.startswith("unpin 200 ") and json.loads(unpin[len("unpin 200 "):])["version"] == "2"
    replies = client.read_replies("pin-out")
    assert replies == expected["1"] + expected["2"]


def test_pinning_a_missing_version_keeps_serving(client, tmp_path, make_requests) -> None:
    demo = write_demo(tmp_path / "demo")
    requests = make_requests(demo, 2)
    p = Processor(demo.config_path.read_text())
    expected = [p.process(r) for r in requests]
    p.close()
    run = client.run("pin", demo.config_path, "7", client.requests_file("miss-req", requests),
                     client.workdir / "miss-out")
    assert run.returncode == 0, run.stderr
    pin = run.stdout.splitlines()[0]
    assert pin.startswith(("pin 500 ", "pin 400 ")), pin
    assert "7" in pin
    assert client.read_replies("miss-out") == expected + expected
    shutil.rmtree(tmp_path / "demo", ignore_errors=True)
