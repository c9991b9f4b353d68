/**
 * The daemon options an in-process reconcile loop needs in a unit test (`reconcileLoopPart`):
 * everything under `dir`, no network filter, no runtime endpoint (tests inject the sandbox
 * source), grace 60 s, interval 1 h.
 */
import { join } from 'node:path';
import type { DaemonOptions } from '../../src/common/daemon-options.ts';

export function loopOptions(dir: string, logLevel: 'error' | 'info'): DaemonOptions {
  return {
    dataDir: join(dir, 'data'),
    cniConfDir: join(dir, 'net.d'),
    network: null,
    runtimeEndpoint: null,
    graceSeconds: 60,
    policy: 'conservative',
    auditLog: join(dir, 'audit.log'),
    intervalSeconds: 3600,
    logLevel,
  } as unknown as DaemonOptions;
}
