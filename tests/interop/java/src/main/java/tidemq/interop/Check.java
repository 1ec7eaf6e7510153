package tidemq.interop;

import java.util.Objects;
import java.util.function.BooleanSupplier;

/** Small assertions whose messages name what was expected and what came. */
public final class Check {
    private Check() {
    }

    public static void that(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    public static void equal(Object expected, Object actual, String what) {
        if (!Objects.equals(expected, actual)) {
            throw new AssertionError(what + ": expected <" + expected + "> but was <" + actual
                    + ">");
        }
    }

    /** Polls {@code condition} every 50 ms until true; AssertionError naming {@code what}. */
    public static void eventually(BooleanSupplier condition, long timeoutMs, String what)
            throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (!condition.getAsBoolean()) {
            if (System.currentTimeMillis() > deadline) {
                throw new AssertionError("timed out after " + timeoutMs + " ms waiting for "
                        + what);
            }
            Thread.sleep(50);
        }
    }
}
