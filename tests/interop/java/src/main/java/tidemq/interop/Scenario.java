package tidemq.interop;

import java.util.Map;

/** One scenario: drives the client against the cluster; throws when the client saw a fault. */
@FunctionalInterface
public interface Scenario {
    /**
     * @param env the cluster and the clients made for this scenario (closed afterwards)
     * @param observed what the client saw, for the pytest side to show or compare
     */
    void run(Env env, Map<String, Object> observed) throws Exception;
}
