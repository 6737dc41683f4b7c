"""`mqttmesh demo`'s workload: who publishes what (the run itself is `mqttmesh demo`, by hand)."""

from __future__ import annotations

import json

from mqttmesh.demo import device_fleet


def test_the_fleet_spreads_devices_over_sites_and_nodes_with_one_legacy_device_in_twenty():
    fleet = device_fleet(sites=2, per_site=20, nodes=3, seed=7)
    assert len(fleet) == 40
    assert [d.node for d in fleet[:7]] == [0, 1, 2, 0, 1, 2, 0]
    legacy = [d for d in fleet if d.legacy]
    assert [(d.client_id, d.topic) for d in legacy] == [
        ("site0-legacy-019", "sensors/site-0/legacy-019/raw"),
        ("site1-legacy-019", "sensors/site-1/legacy-019/raw"),
    ]
    assert fleet[0].client_id == "site0-dev-000" and fleet[0].topic == "sensors/site-0/dev-000/reading"
    assert len({d.client_id for d in fleet}) == 40


def test_readings_are_json_objects_except_the_legacy_ones():
    fleet = device_fleet(sites=1, per_site=20, nodes=1, seed=7)
    first = json.loads(fleet[0].reading(0.0))
    second = json.loads(fleet[0].reading(1.0))
    assert set(first) == {"temperature", "humidity", "battery", "seq"}
    assert (first["seq"], second["seq"]) == (1, 2)
    assert 0 <= first["humidity"] <= 100 and 0 <= first["battery"] <= 100
    text = fleet[19].reading(0.0).decode()
    temp, rh = text.split(";")
    assert 0 < float(temp) < 60 and 0 <= int(rh) <= 100
    assert device_fleet(1, 3, 1, seed=7)[1].reading(5.0) == device_fleet(1, 3, 1, seed=7)[1].reading(5.0)
