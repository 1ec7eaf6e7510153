package tidemq.interop;

import java.util.LinkedHashMap;
import java.util.Map;

/** The scenario groups; each group runs in one JVM (pytest starts one process per group). */
public final class Groups {
    private Groups() {
    }

    public static Map<String, Scenario> of(String group) {
        Map<String, Scenario> scenarios = new LinkedHashMap<>();
        switch (group) {
            case "produce":
                scenarios.put("sync_send", ProduceScenarios::syncSend);
                scenarios.put("async_send", ProduceScenarios::asyncSend);
                scenarios.put("oneway_send", ProduceScenarios::onewaySend);
                scenarios.put("batch_send", ProduceScenarios::batchSend);
                scenarios.put("query_message", ProduceScenarios::queryMessage);
                scenarios.put("search_offset", ProduceScenarios::searchOffset);
                break;
            case "consume":
                scenarios.put("push_clustering", ConsumeScenarios::pushClustering);
                scenarios.put("push_broadcasting", ConsumeScenarios::pushBroadcasting);
                scenarios.put("lite_pull_subscribe", ConsumeScenarios::litePullSubscribe);
                scenarios.put("lite_pull_assign_seek", ConsumeScenarios::litePullAssignSeek);
                scenarios.put("tag_filter", ConsumeScenarios::tagFilter);
                scenarios.put("sql92_filter", ConsumeScenarios::sql92Filter);
                scenarios.put("orderly_with_queue_locks", ConsumeScenarios::orderly);
                break;
            case "reliability":
                scenarios.put("delay_levels", ReliabilityScenarios::delayLevels);
                scenarios.put("retry_then_dlq", ReliabilityScenarios::retryThenDlq);
                scenarios.put("transaction_check", ReliabilityScenarios::transactions);
                break;
            case "admin":
                scenarios.put("cluster_and_broker", AdminScenarios::clusterAndBroker);
                scenarios.put("topic_create_route_stats", AdminScenarios::topicCreateRouteStats);
                scenarios.put("consume_stats_connections", AdminScenarios::consumeStats);
                scenarios.put("offset_reset", AdminScenarios::offsetReset);
                break;
            case "request_reply":
                scenarios.put("request_reply", ExtraScenarios::requestReply);
                break;
            case "acl":
                scenarios.put("acl_signed_and_refused", ExtraScenarios::acl);
                break;
            case "trace":
                scenarios.put("traced_send_consume", TraceScenarios::tracedSendConsume);
                break;
            default:
                throw new IllegalArgumentException("unknown scenario group " + group
                        + " (produce, consume, reliability, admin, request_reply, acl, trace)");
        }
        return scenarios;
    }
}
