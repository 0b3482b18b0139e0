import type { TracingConfig } from '../config/types.js';

/** What the exporter and sampler are built from: the `tracing` section, or the standard variables. */
export interface TracingSettings {
  /** The full URL spans are posted to. */
  readonly url: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly sampleRatio: number;
  readonly serviceName: string;
  /** Whether a caller's `tracestate` is kept in its trace, and so sent on to upstreams (`tracing.client_tracestate`). */
  readonly clientTracestate: boolean;
}

/**
 * The `tracing` section when present; otherwise OpenTelemetry's standard variables, so a
 * deployment that configures every service through them needs nothing more for perch:
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (the base
 * URL), `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, `OTEL_SERVICE_NAME`,
 * `OTEL_TRACES_SAMPLER` with `OTEL_TRACES_SAMPLER_ARG`, and `OTEL_SDK_DISABLED`. Undefined: off.
 */
export function tracingSettings(config: TracingConfig | undefined, env: NodeJS.ProcessEnv): TracingSettings | undefined {
  if (config !== undefined) {
    return { url: tracesUrl(config.endpoint), headers: config.headers ?? {}, sampleRatio: config.sample_ratio, serviceName: config.service_name, clientTracestate: config.client_tracestate };
  }
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return undefined;
  const full = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  const url = full !== undefined && full !== '' ? full : base !== undefined && base !== '' ? tracesUrl(base) : undefined;
  if (url === undefined) return undefined;
  return {
    url,
    headers: { ...keyValues(env.OTEL_EXPORTER_OTLP_HEADERS), ...keyValues(env.OTEL_EXPORTER_OTLP_TRACES_HEADERS) },
    sampleRatio: sampleRatio(env.OTEL_TRACES_SAMPLER, env.OTEL_TRACES_SAMPLER_ARG),
    serviceName: env.OTEL_SERVICE_NAME?.trim() || 'perch',
    clientTracestate: false,
  };
}

/** As the specification joins `OTEL_EXPORTER_OTLP_ENDPOINT` with the signal's path. */
function tracesUrl(endpoint: string): string {
  return `${endpoint.replace(/\/+$/, '')}/v1/traces`;
}

/** `k1=v1,k2=v2`, each part percent-decoded (W3C Baggage's format, as the specification says). */
function keyValues(text: string | undefined): Record<string, string> {
  const pairs: Record<string, string> = {};
  for (const part of (text ?? '').split(',')) {
    const eq = part.indexOf('=');
    if (eq <= 0) continue;
    try {
      pairs[decodeURIComponent(part.slice(0, eq).trim())] = decodeURIComponent(part.slice(eq + 1).trim());
    } catch {
      // A malformed pair is skipped, as the SDKs do; its text may be a secret, so it is not logged.
    }
  }
  return pairs;
}

/**
 * perch always defers to a caller's sampling decision and samples new traces by ratio, so of the
 * standard samplers it honours what that can express: always_on, always_off, and the ratio of
 * traceidratio and parentbased_traceidratio (default 1).
 */
function sampleRatio(sampler: string | undefined, arg: string | undefined): number {
  const name = sampler?.trim().toLowerCase();
  if (name === 'always_off' || name === 'parentbased_always_off') return 0;
  if (name !== 'traceidratio' && name !== 'parentbased_traceidratio') return 1;
  const ratio = Number(arg);
  return arg === undefined || arg.trim() === '' || !Number.isFinite(ratio) ? 1 : Math.min(1, Math.max(0, ratio));
}
