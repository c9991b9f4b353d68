/**
 * The one retry policy helper (house style 7): business code states a policy, this loop does
 * the waiting. Only errors marked retryable (`AppError.isRetryable`) are retried.
 */
import { isAppError } from '../common/errors.ts';

/** How to retry. Delays are in seconds; the delay doubles after each failure up to `maxDelaySeconds`. */
export interface RetryPolicy {
  /** Total number of tries, at least 1. */
  readonly attempts: number;
  /** Wait before the second try, in seconds. */
  readonly initialDelaySeconds: number;
  /** Cap on any single wait, in seconds (default: `initialDelaySeconds`, i.e. a fixed delay). */
  readonly maxDelaySeconds?: number;
  /** Injected sleep (seconds); tests pass a fake. Default: a real timer. */
  readonly delay?: (seconds: number) => Promise<void>;
  /** Stop early when aborted; the last error is thrown. */
  readonly signal?: AbortSignal;
}

const realDelay = (seconds: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/**
 * Calls `fn` until it resolves, it throws a non-retryable error, the attempts are used up or
 * `policy.signal` aborts. Rejects with the last error `fn` threw.
 */
export async function withRetry<T>(policy: RetryPolicy, fn: (attempt: number) => Promise<T>): Promise<T> {
  const delay = policy.delay ?? realDelay;
  const cap = policy.maxDelaySeconds ?? policy.initialDelaySeconds;
  let wait = policy.initialDelaySeconds;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (e) {
      const retryable = isAppError(e) && e.isRetryable;
      if (!retryable || attempt >= policy.attempts || policy.signal?.aborted === true) throw e;
    }
    await delay(wait);
    wait = Math.min(wait * 2, cap);
  }
}
