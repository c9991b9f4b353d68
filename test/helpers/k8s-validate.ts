/**
 * Validation of Kubernetes objects against the API's OpenAPI schemas (`kubernetes-models`, and
 * `@kubernetes-models/prometheus-operator` for the Prometheus Operator's CRDs), failing also on any
 * field the schema does not know. Shared by test/unit/deploy-manifests.test.ts (the kustomize
 * manifests) and test/unit/helm-chart.test.ts (what the chart renders).
 */
import assert from 'node:assert/strict';
import { ConfigMap, Namespace, Service } from 'kubernetes-models/v1';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { PrometheusRule, ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';

/** A plain JSON object. */
export type Obj = Record<string, unknown>;

/** A model class of kubernetes-models: constructed from a plain object, `validate()` throws. */
interface ModelClass {
  new (data: never): object;
  prototype: { validate(this: object): void };
}

/** apiVersion/kind → its model. Every document of deploy/ and of the chart's render must have one. */
export const MODELS: Record<string, ModelClass> = {
  'v1/Namespace': Namespace as unknown as ModelClass,
  'v1/ConfigMap': ConfigMap as unknown as ModelClass,
  'v1/Service': Service as unknown as ModelClass,
  'apps/v1/DaemonSet': DaemonSet as unknown as ModelClass,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor as unknown as ModelClass,
  'monitoring.coreos.com/v1/PrometheusRule': PrometheusRule as unknown as ModelClass,
};

/** A non-null, non-array object. */
export function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Validate `obj` against its API schema and fail on fields the schema does not know.
 * The schema check is the model's `validate()` (ajv code generated from the OpenAPI schemas). It
 * is run on a proxy of the object that records every property the validator reads: a validator
 * reads each property its schema defines (and each key of a map, `additionalProperties`), so a
 * property present in the object and never read is one the schema has no place for.
 * @throws Error naming the schema violation, or listing the unknown fields by JSON path.
 */
export function validateStrict(obj: unknown): void {
  if (!isObj(obj)) throw new Error('not an object');
  const key = `${String(obj.apiVersion)}/${String(obj.kind)}`;
  const Model = MODELS[key];
  if (Model === undefined) throw new Error(`no schema for ${key}`);
  const model = new Model(obj as never) as Obj;
  const read = new WeakMap<object, Set<PropertyKey>>();
  const proxies = new WeakMap<object, object>();
  const track = <T extends object>(target: T): T => {
    const known = proxies.get(target);
    if (known !== undefined) return known as T;
    read.set(target, new Set());
    const p = new Proxy(target, {
      get(t, k, r) {
        read.get(t)?.add(k);
        const v: unknown = Reflect.get(t, k, r);
        return typeof v === 'object' && v !== null ? track(v) : v;
      },
    });
    proxies.set(target, p);
    return p;
  };
  Model.prototype.validate.call(track(model));
  const unknown: string[] = [];
  const walk = (v: unknown, path: string): void => {
    if (Array.isArray(v)) {
      v.forEach((x, i) => walk(x, `${path}/${i}`));
      return;
    }
    if (!isObj(v)) return;
    const seen = read.get(v) ?? new Set<PropertyKey>();
    for (const [k, x] of Object.entries(v)) {
      if (!seen.has(k)) unknown.push(`${path}/${k}`);
      else walk(x, `${path}/${k}`);
    }
  };
  walk(model, '');
  if (unknown.length > 0) throw new Error(`${key}: unknown field${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}`);
}

/** `o.a.b.c` with a clear failure when a step is missing. */
export function at(o: unknown, ...path: (string | number)[]): unknown {
  let v = o;
  for (const k of path) {
    assert.ok(typeof v === 'object' && v !== null, `${path.join('.')}: ${String(k)} of a non-object`);
    v = (v as Record<string | number, unknown>)[k];
  }
  return v;
}
