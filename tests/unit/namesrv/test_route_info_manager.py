"""RouteInfoManager: what brokers register becomes the routes clients get."""

from __future__ import annotations

from tidemq.namesrv.register_body import RegisterBrokerBody, RegisteredTopicConfig
from tidemq.namesrv.route_data import PERM_READ, PERM_WRITE, DataVersion
from tidemq.namesrv.route_info_manager import RouteInfoManager

MASTER_A = "10.0.0.1:10911"
SLAVE_A = "10.0.0.2:10911"
MASTER_B = "10.0.0.3:10911"


def topics(*names: str, queues: int = 4, perm: int = 6) -> dict[str, RegisteredTopicConfig]:
    return {name: RegisteredTopicConfig(name, queues, queues, perm) for name in names}


def body(counter: int, *names: str, queues: int = 4) -> RegisterBrokerBody:
    return RegisterBrokerBody(DataVersion(counter, 1_700_000_000_000), topics(*names,
                                                                              queues=queues))


def register(manager, addr=MASTER_A, name="broker-a", broker_id=0, *, cluster="DefaultCluster",
             registration=None, connection=None, now_ms=1000, **kwargs):
    return manager.register_broker(
        cluster_name=cluster, broker_addr=addr, broker_name=name, broker_id=broker_id,
        ha_server_addr=addr.replace("10911", "10912"),
        body=registration if registration is not None else body(1, "Orders"),
        connection=connection, now_ms=now_ms, **kwargs,
    )


def test_master_registration_makes_a_route():
    manager = RouteInfoManager()
    result = register(manager, registration=body(1, "Orders", "Payments"))

    route = manager.topic_route("Orders")
    assert result.master_addr is None and result.ha_server_addr is None
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
            for q in route.queue_datas] == [("broker-a", 4, 4, 6)]
    assert [(b.cluster, b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
        ("DefaultCluster", "broker-a", {0: MASTER_A})]
    assert manager.all_topics() == ["Orders", "Payments"]
    assert manager.live_broker_addrs() == [MASTER_A]


def test_unknown_topic_has_no_route():
    manager = RouteInfoManager()
    register(manager)
    assert manager.topic_route("Nope") is None


def test_route_spans_every_broker_name_serving_the_topic():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders", queues=4))
    register(manager, MASTER_B, "broker-b", registration=body(1, "Orders", queues=8))

    route = manager.topic_route("Orders")
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4), ("broker-b", 8)]
    assert [b.broker_name for b in route.broker_datas] == ["broker-a", "broker-b"]
    assert manager.cluster_info().cluster_addr_table == {"DefaultCluster": ["broker-a",
                                                                             "broker-b"]}


def test_route_is_a_copy_later_registrations_do_not_change():
    manager = RouteInfoManager()
    register(manager)
    route = manager.topic_route("Orders")
    register(manager, SLAVE_A, broker_id=1)
    manager.wipe_write_perm("broker-a")
    assert route.broker_datas[0].broker_addrs == {0: MASTER_A}
    assert route.queue_datas[0].perm == 6


def test_slave_learns_its_master_and_does_not_change_topics():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders"))
    result = register(manager, SLAVE_A, broker_id=1, registration=body(9, "Orders", "SlaveOnly"))

    assert result.master_addr == MASTER_A
    assert result.ha_server_addr == "10.0.0.1:10912"
    assert manager.topic_route("SlaveOnly") is None
    route = manager.topic_route("Orders")
    assert route.broker_datas[0].broker_addrs == {0: MASTER_A, 1: SLAVE_A}


def test_slave_without_a_live_master_gets_no_master_address():
    manager = RouteInfoManager()
    result = register(manager, SLAVE_A, broker_id=1)
    assert result.master_addr is None and result.ha_server_addr is None


def test_topics_change_only_when_the_data_version_changes():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders", queues=4))
    # Same version, different table: an unchanged broker's periodic registration is trusted.
    register(manager, registration=body(1, "Orders", "Late", queues=16))
    assert manager.topic_route("Late") is None
    assert manager.topic_route("Orders").queue_datas[0].write_queue_nums == 4

    register(manager, registration=body(2, "Orders", "Late", queues=16))
    assert manager.topic_route("Late") is not None
    assert manager.topic_route("Orders").queue_datas[0].write_queue_nums == 16


def test_re_registering_after_leaving_applies_topics_even_with_the_same_version():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders"))
    manager.unregister_broker(cluster_name="DefaultCluster", broker_addr=MASTER_A,
                              broker_name="broker-a", broker_id=0)
    assert manager.topic_route("Orders") is None
    register(manager, registration=body(1, "Orders"))
    assert manager.topic_route("Orders") is not None


def test_brokers_silent_past_the_expiry_are_dropped_with_their_topics():
    manager = RouteInfoManager()
    connection = object()
    register(manager, connection=connection, now_ms=1_000)
    register(manager, MASTER_B, "broker-b", registration=body(1, "Orders", "OnlyB"),
             now_ms=100_000)

    assert manager.scan_not_active_brokers(now_ms=121_000, expired_time_ms=120_000) == []
    expired = manager.scan_not_active_brokers(now_ms=121_001, expired_time_ms=120_000)

    assert [live.connection for live in expired] == [connection]
    assert manager.live_broker_addrs() == [MASTER_B]
    assert [q.broker_name for q in manager.topic_route("Orders").queue_datas] == ["broker-b"]
    assert list(manager.cluster_info().broker_addr_table) == ["broker-b"]


def test_registering_again_keeps_a_broker_alive():
    manager = RouteInfoManager()
    register(manager, now_ms=1_000)
    register(manager, now_ms=100_000)
    assert manager.scan_not_active_brokers(now_ms=200_000, expired_time_ms=120_000) == []
    assert manager.topic_route("Orders") is not None


def test_touch_counts_as_a_sign_of_life():
    manager = RouteInfoManager()
    register(manager, now_ms=1_000)
    manager.touch_broker(MASTER_A, 100_000)
    assert manager.scan_not_active_brokers(now_ms=200_000, expired_time_ms=120_000) == []


def test_closed_connection_drops_the_brokers_registered_over_it():
    manager = RouteInfoManager()
    connection_a, connection_b = object(), object()
    register(manager, connection=connection_a)
    register(manager, MASTER_B, "broker-b", registration=body(1, "Other"),
             connection=connection_b)

    assert manager.connection_closed(connection_a) == [MASTER_A]
    assert manager.topic_route("Orders") is None
    assert manager.topic_route("Other") is not None
    assert manager.cluster_info().cluster_addr_table == {"DefaultCluster": ["broker-b"]}


def test_old_connection_closing_after_a_reconnect_keeps_the_broker():
    manager = RouteInfoManager()
    old, new = object(), object()
    register(manager, connection=old)
    register(manager, connection=new)
    assert manager.connection_closed(old) == []
    assert manager.topic_route("Orders") is not None


def test_master_leaving_keeps_the_slave_in_the_route():
    manager = RouteInfoManager()
    register(manager)
    register(manager, SLAVE_A, broker_id=1)
    manager.unregister_broker(cluster_name="DefaultCluster", broker_addr=MASTER_A,
                              broker_name="broker-a", broker_id=0)

    route = manager.topic_route("Orders")
    assert route.broker_datas[0].broker_addrs == {1: SLAVE_A}
    manager.unregister_broker(cluster_name="DefaultCluster", broker_addr=SLAVE_A,
                              broker_name="broker-a", broker_id=1)
    assert manager.topic_route("Orders") is None
    assert manager.cluster_info().broker_addr_table == {}
    assert manager.cluster_info().cluster_addr_table == {}
    assert manager.live_broker_addrs() == []


def test_promoted_slave_is_listed_once_under_its_new_id():
    manager = RouteInfoManager()
    register(manager, SLAVE_A, broker_id=1)
    register(manager, SLAVE_A, broker_id=0, registration=body(5, "Orders"))
    assert manager.topic_route("Orders").broker_datas[0].broker_addrs == {0: SLAVE_A}


def test_wipe_and_add_write_permission():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders", "Payments"))
    register(manager, MASTER_B, "broker-b", registration=body(1, "Orders"))

    assert manager.wipe_write_perm("broker-a") == 2
    perms = {q.broker_name: q.perm for q in manager.topic_route("Orders").queue_datas}
    assert perms == {"broker-a": PERM_READ, "broker-b": PERM_READ | PERM_WRITE}
    # The broker's unchanged periodic registration does not give write permission back.
    register(manager, registration=body(1, "Orders", "Payments"))
    assert manager.topic_route("Payments").queue_datas[0].perm == PERM_READ

    assert manager.add_write_perm("broker-a") == 2
    assert manager.topic_route("Payments").queue_datas[0].perm == PERM_READ | PERM_WRITE
    assert manager.wipe_write_perm("no-such-broker") == 0


def test_delete_topic_everywhere_or_in_one_cluster():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders", "Payments"))
    register(manager, MASTER_B, "broker-b", cluster="Other", registration=body(1, "Orders"))

    assert manager.delete_topic("Orders", "Other") is True
    assert [q.broker_name for q in manager.topic_route("Orders").queue_datas] == ["broker-a"]
    assert manager.delete_topic("Payments") is True
    assert manager.topic_route("Payments") is None
    assert manager.delete_topic("Payments") is False
    assert manager.all_topics() == ["Orders"]


def test_topics_by_cluster():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders", "Payments"))
    register(manager, MASTER_B, "broker-b", cluster="Other", registration=body(1, "Orders",
                                                                                "Audit"))
    assert manager.topics_by_cluster("DefaultCluster") == ["Orders", "Payments"]
    assert manager.topics_by_cluster("Other") == ["Audit", "Orders"]
    assert manager.topics_by_cluster("Nope") == []


def test_data_version_tracking():
    manager = RouteInfoManager()
    assert manager.is_topic_config_changed(MASTER_A, DataVersion(1, 5)) is True
    register(manager, registration=RegisterBrokerBody(DataVersion(1, 5)))
    assert manager.is_topic_config_changed(MASTER_A, DataVersion(1, 5)) is False
    assert manager.is_topic_config_changed(MASTER_A, DataVersion(2, 5)) is True
    assert manager.data_version_of(MASTER_A) == DataVersion(1, 5)
    assert manager.data_version_of(MASTER_B) is None


def test_registration_can_drop_topics_the_master_no_longer_lists():
    manager = RouteInfoManager()
    register(manager, registration=body(1, "broker-a", "Orders", "Old"))
    # An increment (only the topics just created) drops nothing, even with the option on.
    register(manager, registration=body(2, "Fresh"), delete_missing_topics=True)
    assert manager.all_topics() == ["Fresh", "Old", "Orders", "broker-a"]
    # A whole table (it lists the broker's own topic) drops what it no longer lists.
    register(manager, registration=body(3, "broker-a", "Orders"), delete_missing_topics=True)
    assert manager.all_topics() == ["Orders", "broker-a"]
    # Off (the 4.x default): a registration listing only changed topics keeps the others.
    register(manager, registration=body(4, "New"))
    assert manager.all_topics() == ["New", "Orders", "broker-a"]


def test_filter_servers_appear_in_the_route():
    manager = RouteInfoManager()
    registration = body(1, "Orders")
    registration.filter_server_list = ["10.0.0.1:9999"]
    register(manager, registration=registration)
    assert manager.topic_route("Orders").filter_server_table == {MASTER_A: ["10.0.0.1:9999"]}
    register(manager, registration=body(2, "Orders"))
    assert manager.topic_route("Orders").filter_server_table == {}


def test_a_failover_moves_brokerid_0_and_the_demoted_master_registers_as_a_slave(caplog):
    manager = RouteInfoManager()
    register(manager, registration=body(1, "Orders"))
    register(manager, SLAVE_A, broker_id=1, registration=body(1, "Orders"))
    with caplog.at_level("INFO", logger="tidemq.namesrv"):
        register(manager, SLAVE_A, broker_id=0, registration=body(2, "Orders"))  # promoted
    assert "broker-a: master address change from 10.0.0.1:10911 to 10.0.0.2:10911" in (
        caplog.text)
    # The promoted slave is listed once (its old id went), as brokerId 0, which clients write to.
    assert manager.topic_route("Orders").broker_datas[0].broker_addrs == {0: SLAVE_A}
    # The old master comes back as a slave with its own id and learns its new master.
    result = register(manager, MASTER_A, broker_id=1, registration=body(1, "Orders"))
    assert result.master_addr == SLAVE_A
    assert manager.topic_route("Orders").broker_datas[0].broker_addrs == {0: SLAVE_A,
                                                                          1: MASTER_A}
