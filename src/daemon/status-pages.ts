/**
 * The node's status pages the daemon serves on its metrics listener (docs/daemon.md "Status
 * pages"): `/status`, the page `ipwarden status --html` writes, and `/status.json`, the document
 * `ipwarden status --json` prints — the same status model (`collectStatus`, src/reconcile/status.ts)
 * with the daemon's own flags, so an operator can read the node's address map without a shell on
 * the node (`kubectl port-forward`, or a browser on the metrics address).
 *
 * Each report is made on request, never from a cache older than the request: one runtime
 * snapshot (CRI `ListPodSandbox`), the kernel evidence (a read of every network namespace, with
 * the asynchronous reader: plugin requests are answered meanwhile), then each network read under its lock (at most {@link STATUS_LOCK_TIMEOUT_SECONDS}
 * each). That is a pass's reading without its releases, so requests go through a
 * {@link RenderGate} of their own: every request is answered by a report begun at or after it
 * arrived, reports never overlap and begin at least {@link STATUS_RENDER_INTERVAL_MS} apart, and
 * every request that arrives meanwhile shares the next one (the same bytes). A flood of requests
 * on any number of connections thus costs at most one report per interval. The HTML and the JSON
 * of one report are each rendered once, when first asked. Reports are counted in
 * `ipwarden_status_renders_total`.
 *
 * The HTML renderer is the CLI's (src/cli/html.ts), a peer layer the daemon does not import:
 * src/cold.ts hands it in ({@link StatusHtmlRenderer}).
 */
import { Counter, type Registry } from 'prom-client';
import type { StatusReport } from '../reconcile/status.ts';
import { statusToJson } from '../reconcile/status.ts';
import { RenderGate, REAL_GATE_CLOCK, type GateClock, type StatusPage, type StatusPages } from './metrics.ts';

/**
 * Least time between the starts of two status reports, milliseconds: however many requests, the
 * daemon makes at most one report (a CRI list, a kernel evidence read, each network's lock) per
 * 5 s. A request that follows another within 5 s waits for the next report.
 */
export const STATUS_RENDER_INTERVAL_MS = 5000;

/** Seconds a status report waits for each network's lock (a pass's wait; a request must not hold up pods). */
export const STATUS_LOCK_TIMEOUT_SECONDS = 5;

/**
 * Renders the page of `ipwarden status --html` (src/cli/html.ts `renderStatusHtml`): pure, every
 * text from disk escaped. `generatedAtMs` is shown in the header (milliseconds since the epoch).
 */
export type StatusHtmlRenderer = (r: StatusReport, opts: { readonly generatedAtMs: number }) => string;

/**
 * The Content-Security-Policy the page is served with (also in its own `<meta>`): it loads
 * nothing; its inline style and its one inline script (legend buttons, hover text) run.
 */
export const STATUS_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'";

/** Headers of both pages: never cached (a report is of one instant), never sniffed as another type. */
const COMMON_HEADERS = { 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' } as const;

/** One report and its two renderings, each made when first asked. */
class Rendered {
  private htmlPage: StatusPage | null = null;
  private jsonPage: StatusPage | null = null;
  private readonly report: StatusReport;
  private readonly generatedAtMs: number;
  private readonly renderHtml: StatusHtmlRenderer | null;
  constructor(report: StatusReport, generatedAtMs: number, renderHtml: StatusHtmlRenderer | null) {
    this.report = report;
    this.generatedAtMs = generatedAtMs;
    this.renderHtml = renderHtml;
  }

  json(): StatusPage {
    this.jsonPage ??= {
      body: Buffer.from(`${JSON.stringify(statusToJson(this.report))}\n`, 'utf8'),
      contentType: 'application/json; charset=utf-8',
      headers: COMMON_HEADERS,
    };
    return this.jsonPage;
  }

  html(): StatusPage {
    if (this.renderHtml === null) throw new Error('this daemon was started without the status page renderer');
    this.htmlPage ??= {
      body: Buffer.from(this.renderHtml(this.report, { generatedAtMs: this.generatedAtMs }), 'utf8'),
      contentType: 'text/html; charset=utf-8',
      headers: { ...COMMON_HEADERS, 'Content-Security-Policy': STATUS_PAGE_CSP },
    };
    return this.htmlPage;
  }
}

/** What {@link DaemonStatusPages} is made with. */
export interface StatusPagesOptions {
  /** Makes one report (the agent: `collectStatus` with the daemon's flags and its own stores). */
  readonly collect: () => Promise<StatusReport>;
  /** The page renderer, or null (then `/status` answers 500 and `/status.json` still works). */
  readonly renderHtml: StatusHtmlRenderer | null;
  /** Where `ipwarden_status_renders_total` is registered (the daemon's metrics registry). */
  readonly registry: Registry;
  /** Wall clock for the page's "generated" line, milliseconds since the epoch (default `Date.now`). */
  readonly now?: () => number;
  /** Least time between two reports, milliseconds (default {@link STATUS_RENDER_INTERVAL_MS}). */
  readonly intervalMs?: number;
  /** The spacing's clock (default {@link REAL_GATE_CLOCK}; tests inject a fake one). */
  readonly gateClock?: GateClock;
}

/** The daemon's {@link StatusPages}: reports shared and spaced by a {@link RenderGate} (module comment). */
export class DaemonStatusPages implements StatusPages {
  private readonly gate: RenderGate<Rendered>;
  private readonly renders: Counter;

  /** @param o see {@link StatusPagesOptions} */
  constructor(o: StatusPagesOptions) {
    const now = o.now ?? (() => Date.now());
    this.renders = new Counter({
      name: 'ipwarden_status_renders_total',
      help: 'Reports made for /status and /status.json (requests that arrive while one is due share it; at most one per 5 s).',
      registers: [o.registry],
    });
    this.gate = new RenderGate(
      async () => {
        this.renders.inc();
        const report = await o.collect();
        return new Rendered(report, now(), o.renderHtml);
      },
      o.intervalMs ?? STATUS_RENDER_INTERVAL_MS,
      o.gateClock ?? REAL_GATE_CLOCK,
    );
  }

  /** Reports begun so far. */
  get reports(): number {
    return this.gate.renders;
  }

  /** @inheritdoc */
  async get(kind: 'html' | 'json'): Promise<StatusPage> {
    const r = await this.gate.get();
    return kind === 'html' ? r.html() : r.json();
  }
}
