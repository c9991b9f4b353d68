/**
 * Steps of the leak → exhaustion → heal flow on a running lab, shared by `npm run lab`
 * (src/lab/main.ts) and the e2e tests (test/e2e/lab-flow.test.ts, test/e2e/heal.test.ts).
 * Each step only acts and reports what it observed; the callers decide what is expected.
 *
 * The leak causes are the two of containerd-lab.md "Observed later": a chained CNI plugin whose
 * ADD and DEL both fail (the sandbox stays NOTREADY and keeps its reservation) and the runtime
 * losing its sandbox records ({@link Lab.wipeRuntimeState}), which turns every earlier
 * reservation into a true leak.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { AppError } from '../common/errors.ts';
import type { ReportJson } from '../cli/leaks.ts';
import { IPWARDEN_BUNDLE, type Lab } from './lab.ts';
import { defaultAuditLogPath } from '../reconcile/audit.ts';

/** A sandbox the flow created and the address reserved for it ('' when it holds none). */
export interface Pod {
  readonly name: string;
  /** Full 64-hex sandbox id (= CNI_CONTAINERID). */
  readonly id: string;
  readonly ip: string;
  readonly state: 'ready' | 'notready';
}

/** Result of {@link tryRunPod}: the pod, or the runtime's error text. */
export type RunOutcome = { readonly ok: true; readonly pod: Pod } | { readonly ok: false; readonly error: string };

/**
 * Number of addresses host-local and ipwarden hand out from an IPv4 `subnet` with default
 * range bounds: network, gateway (`.1`) and broadcast are excluded (containerd-lab.md §1).
 * @throws Error for an IPv6 or malformed subnet (the lab uses IPv4 only).
 */
export function capacityOf(subnet: string): number {
  const m = /^\d+\.\d+\.\d+\.\d+\/(\d+)$/.exec(subnet);
  if (m === null) throw new Error(`capacityOf: not an IPv4 CIDR: ${subnet}`);
  return 2 ** (32 - Number(m[1])) - 3;
}

/** The range set text host-local prints for an IPv4 `subnet` with default bounds (`10.244.9.1-10.244.9.14`). */
export function rangeSetText(subnet: string): string {
  const [addr = '', bits = ''] = subnet.split('/');
  const base = addr.split('.').reduce((n, o) => n * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(bits));
  const text = (n: number): string => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
  return `${text(base + 1)}-${text(base + size - 2)}`;
}

/** The containerd part of a CRI error: from `failed to setup network …` on, else the whole message. */
export function runtimeErrorText(e: unknown): string {
  const msg = e instanceof AppError || e instanceof Error ? e.message : String(e);
  const i = msg.indexOf('failed to setup network for sandbox');
  return i >= 0 ? msg.slice(i) : msg;
}

function ipOf(lab: Lab, id: string): string {
  return lab.reservations().find((r) => r.id === id)?.ip ?? '';
}

/** RunPodSandbox `name`; resolves to the READY pod and its reserved address, or the error text. */
export async function tryRunPod(lab: Lab, name: string): Promise<RunOutcome> {
  try {
    const id = await lab.runSandbox(name);
    return { ok: true, pod: { name, id, ip: ipOf(lab, id), state: 'ready' } };
  } catch (e) {
    return { ok: false, error: runtimeErrorText(e) };
  }
}

/**
 * RunPodSandbox `name` while the chained plugin is in `fail` mode: the call must fail and leave a
 * NOTREADY sandbox that still holds its reservation.
 * @throws Error when RunPodSandbox succeeds or no NOTREADY sandbox named `name` is listed.
 */
export async function runBrokenPod(lab: Lab, name: string): Promise<Pod & { error: string }> {
  const r = await tryRunPod(lab, name);
  if (r.ok) throw new Error(`RunPodSandbox ${name} succeeded although the chained plugin fails`);
  const s = (await lab.listSandboxes()).find((x) => x.name === name);
  if (s === undefined || s.state !== 'notready') throw new Error(`no NOTREADY sandbox ${name} after: ${r.error}`);
  return { name, id: s.id, ip: ipOf(lab, s.id), state: 'notready', error: r.error };
}

/** Runs READY pods `<prefix>-1`, `<prefix>-2`, … until every address of the lab's range is reserved. */
export async function fillRange(lab: Lab, prefix: string): Promise<Pod[]> {
  const cap = capacityOf(lab.subnet);
  const pods: Pod[] = [];
  while (lab.reservations().length < cap) {
    const r = await tryRunPod(lab, `${prefix}-${pods.length + 1}`);
    if (!r.ok) throw new Error(`fillRange: ${r.error}`);
    pods.push(r.pod);
  }
  return pods;
}

/** Resolves once every reservation file named by `ips` is older than `seconds` (mtime). */
export async function waitUntilOlder(lab: Lab, ips: readonly string[], seconds: number): Promise<void> {
  const newest = Math.max(0, ...ips.map((ip) => statSync(join(lab.networkDir, ip)).mtimeMs));
  const wait = newest + seconds * 1000 + 50 - Date.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
}

/** Output of one `ipwarden` CLI run. */
export interface CliRun {
  readonly status: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs the built CLI (`node dist/ipwarden.cjs ARGS`) synchronously, 60 s timeout. */
export function ipwarden(args: readonly string[]): CliRun {
  const r = spawnSync(process.execPath, [IPWARDEN_BUNDLE, ...args], { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** `--data-dir --network --runtime-endpoint --grace` of the lab. */
export function labArgs(lab: Lab, grace: string): string[] {
  return ['--data-dir', lab.dataDir, '--network', lab.networkName, '--runtime-endpoint', lab.endpoint, '--grace', grace];
}

/**
 * `ipwarden leaks|gc … --json` against the lab; parses the report.
 * @throws Error with the CLI's stderr when it exits non-zero or prints no JSON.
 */
export function reconcileJson(lab: Lab, cmd: 'leaks' | 'gc', grace: string): ReportJson {
  const r = ipwarden([cmd, ...labArgs(lab, grace), '--json']);
  if (r.status !== 0) throw new Error(`ipwarden ${cmd} exited ${String(r.status)}: ${r.stderr}`);
  return JSON.parse(r.stdout) as ReportJson;
}

/** Reservations of a report grouped by verdict: verdict → sorted IPs. */
export function byVerdict(report: ReportJson): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const n of report.networks) for (const r of n.reservations) (out[r.verdict] ??= []).push(r.ip);
  for (const v of Object.values(out)) v.sort(ipCompare);
  return out;
}

/** Numeric order of dotted IPv4 texts. */
export function ipCompare(a: string, b: string): number {
  const n = (s: string): number => s.split('.').reduce((x, o) => x * 256 + Number(o), 0);
  return n(a) - n(b);
}

/** Sorted IPs of `pods`. */
export function ipsOf(pods: readonly Pod[]): string[] {
  return pods.map((p) => p.ip).sort(ipCompare);
}

/** One line of the audit log (`<dataDir>/.ipwarden-audit.log`, JSON lines). */
export interface AuditLine {
  readonly network: string;
  readonly ip: string;
  readonly containerId: string | null;
  readonly reason: string;
  readonly [k: string]: unknown;
}

/**
 * The lab's audit log lines that say what happened (`[]` when there is none): one `released` (or
 * `kept`) line per release and one `reserved` line per recreated reservation. The `intent` line
 * each release writes before removing the file (docs/cli.md "Audit log") is left out.
 */
export function auditLines(lab: Lab): AuditLine[] {
  let text: string;
  try {
    text = readFileSync(defaultAuditLogPath(lab.dataDir), 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as AuditLine)
    .filter((a) => a['phase'] !== 'intent');
}

/** Raw content of each reservation file of the lab's network: ip → content. */
export function reservationContents(lab: Lab): Map<string, string> {
  return new Map(lab.reservations().map((r) => [r.ip, readFileSync(join(lab.networkDir, r.ip), 'utf8')]));
}
