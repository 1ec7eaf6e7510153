"""format("tidemq") with accessKey / secretKey against a broker with aclEnable=true: the sink
and the source sign every request, a wrong secret fails the job, and the secret key appears
in no plan."""

from __future__ import annotations

import asyncio

import pytest

from routed_topics import create_routed_topic
from tidemq.client import Credentials

pytestmark = pytest.mark.spark

ACL_YAML = """\
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: spark-app
    secretKey: spark-app-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
SECRET = "spark-app-secret"


@pytest.fixture
def acl_namesrv(tidemq_cluster, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    cluster = tidemq_cluster(broker_overrides={"aclEnable": "true", "aclFilePath": str(path)})

    asyncio.run(create_routed_topic(cluster.namesrv_addr, "SparkSigned", 2,
                                    credentials=Credentials("operator", "operator-secret")))
    return cluster.namesrv_addr


def test_sink_and_source_sign_with_the_options_and_hide_the_secret(spark, acl_namesrv):
    rows = [(f"row-{i}".encode(),) for i in range(50)]
    df = spark.createDataFrame(rows, "body binary").repartition(2)
    (df.write.format("tidemq").option("namesrvAddr", acl_namesrv).option("topic", "SparkSigned")
     .option("accessKey", "spark-app").option("secretKey", SECRET).mode("append").save())

    reader = (spark.read.format("tidemq").option("namesrvAddr", acl_namesrv)
              .option("subscribe", "SparkSigned").option("accessKey", "spark-app")
              .option("secretKey", SECRET).load())
    assert sorted(r.body for r in reader.collect()) == sorted(body for (body,) in rows)
    plan = reader._jdf.queryExecution().toString()
    assert SECRET not in plan

    with pytest.raises(Exception, match=r"NO_PERMISSION|does not match"):
        (df.write.format("tidemq").option("namesrvAddr", acl_namesrv)
         .option("topic", "SparkSigned").option("accessKey", "spark-app")
         .option("secretKey", "not-the-secret").mode("append").save())
    unsigned = (spark.read.format("tidemq").option("namesrvAddr", acl_namesrv)
                .option("subscribe", "SparkSigned").load())
    with pytest.raises(Exception, match=r"NO_PERMISSION|not signed"):
        unsigned.collect()
