from tidemq.limits import group_name_problem, topic_name_problem


def test_topic_name_rules_follow_rocketmq():
    assert topic_name_problem("Orders") is None
    assert topic_name_problem("%RETRY%cg_1|x-y") is None
    assert "blank" in topic_name_problem("  ")
    assert "outside" in topic_name_problem("bad topic")
    assert "127" in topic_name_problem("t" * 128)
    assert topic_name_problem("t" * 127) is None


def test_group_name_rules_follow_rocketmq():
    assert group_name_problem("cg") is None
    assert "255" in group_name_problem("g" * 256)
    assert "outside" in group_name_problem("g/1")
