import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Counter, Histogram, Registry } from 'prom-client';
import { FastCounter, FastHistogram } from '../src/metrics/fast-metrics.js';

const BUCKETS = [0.001, 0.01, 0.1, 1];

test('FastHistogram exposes exactly what a prom-client Histogram does for the same observations', { timeout: 5000 }, async () => {
  const reference = new Registry();
  const fast = new Registry();
  const histogram = new Histogram({ name: 'x_seconds', help: 'h', labelNames: ['route', 'cache'], buckets: BUCKETS, registers: [reference] });
  const mine = new FastHistogram('x_seconds', 'h', ['route', 'cache'], BUCKETS, fast);
  const observations: [string, string, number][] = [
    ['user', 'hit', 0.0005],
    ['user', 'hit', 0.001],
    ['user', 'hit', 0.05],
    ['tweet', 'miss', 2],
    ['tweet', 'miss', 0.1],
    ['user', 'hit', 0.0011],
  ];
  for (const [route, cache, value] of observations) {
    histogram.observe({ route, cache }, value);
    mine.observe(value, route, cache);
  }
  assert.equal(await fast.metrics(), await reference.metrics());
});

test('FastCounter exposes exactly what a prom-client Counter does, for one to three labels', { timeout: 5000 }, async () => {
  const reference = new Registry();
  const fast = new Registry();
  const counter = new Counter({ name: 'y_total', help: 'c', labelNames: ['route', 'status', 'cache'], registers: [reference] });
  const byKey = new Counter({ name: 'z_total', help: 'k', labelNames: ['key_id'], registers: [reference] });
  const mine = new FastCounter('y_total', 'c', ['route', 'status', 'cache'], fast);
  const mineByKey = new FastCounter('z_total', 'k', ['key_id'], fast);
  // Values that would collide if the three were joined with "|" into one key.
  for (const [route, status, cache] of [
    ['user', 200, 'hit'],
    ['user', 200, 'hit'],
    ['tweet', 404, 'miss'],
    ['a|b', 200, 'c'],
    ['a', 200, 'b|c'],
  ] as const) {
    counter.inc({ route, status: String(status), cache });
    mine.inc(route, status, cache);
  }
  for (const key of ['k1', 'k2', 'k1']) {
    byKey.inc({ key_id: key });
    mineByKey.inc(key);
  }
  assert.equal(await fast.metrics(), await reference.metrics());
  fast.resetMetrics();
  reference.resetMetrics();
  mine.inc('user', 200, 'hit');
  counter.inc({ route: 'user', status: '200', cache: 'hit' });
  assert.equal(await fast.metrics(), await reference.metrics());
});
