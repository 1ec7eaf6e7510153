package tidemq.interop;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Runs one group of scenarios of the official RocketMQ Java client in this JVM and writes a
 * result document for pytest (tests/interop/test_java_client.py).
 *
 * <p>Usage: {@code Main <group> --namesrv HOST:PORT --out FILE --timeout-s N [--only a,b]}.
 * The document is {@code {"ok": bool, "group": ..., "scenarios": {name: {"ok": bool,
 * "error": text, "seconds": s, "observed": {...}}}}}: one scenario failing does not stop the
 * others, so pytest reports each on its own. The process exits 0 when it wrote the document,
 * whatever the scenarios found, and calls System.exit so that no client thread keeps it alive.
 */
public final class Main {
    private Main() {
    }

    public static void main(String[] args) throws Exception {
        String group = args[0];
        Map<String, String> options = new LinkedHashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
            options.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        Env env = new Env(options.get("namesrv"),
                (long) (Double.parseDouble(options.getOrDefault("timeout-s", "120")) * 1000));
        Map<String, Scenario> scenarios = Groups.of(group);
        List<String> only = options.containsKey("only")
                ? List.of(options.get("only").split(",")) : new ArrayList<>(scenarios.keySet());
        Map<String, Object> results = new LinkedHashMap<>();
        boolean allOk = true;
        for (String name : only) {
            Scenario scenario = scenarios.get(name);
            if (scenario == null) {
                throw new IllegalArgumentException("no scenario " + name + " in group " + group
                        + "; known: " + scenarios.keySet());
            }
            Map<String, Object> result = new LinkedHashMap<>();
            Map<String, Object> observed = new LinkedHashMap<>();
            long start = System.nanoTime();
            System.out.println("scenario " + name + " starts");
            try {
                scenario.run(env, observed);
                result.put("ok", true);
            } catch (Throwable failure) {
                allOk = false;
                StringWriter trace = new StringWriter();
                failure.printStackTrace(new PrintWriter(trace));
                result.put("ok", false);
                result.put("error", trace.toString());
            } finally {
                env.closeAll();
            }
            result.put("seconds", (System.nanoTime() - start) / 1e9);
            result.put("observed", observed);
            results.put(name, result);
            System.out.println("scenario " + name + " ok=" + result.get("ok"));
        }
        Map<String, Object> document = new LinkedHashMap<>();
        document.put("ok", allOk);
        document.put("group", group);
        document.put("serializeType", System.getProperty("rocketmq.serialize.type", "JSON"));
        document.put("scenarios", results);
        Path out = Paths.get(options.get("out"));
        Files.write(out, JSON.toJSONString(document, SerializerFeature.PrettyFormat)
                .getBytes(StandardCharsets.UTF_8));
        System.out.flush();
        System.exit(0);
    }
}
