import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Counter, Histogram, Registry } from 'prom-client';
import { FastCounter, FastHistogram } from '../src/observability/fast-metrics.js';

const BUCKETS = [0.001, 0.01, 0.1, 1];

test('FastHistogram exposes exactly what a prom-client Histogram does for the same observations', { timeout: 5000 }, async () => {
  const reference = new Registry();
  const fast = new Registry();
  const histogram = new Histogram({ name: 'x_seconds', help: 'h', labelNames: ['route', 'cache'], buckets: BUCKETS, registers: [reference] });
  const mine = new FastHistogram('x_seconds', 'h', BUCKETS, fast);
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
    mine.observe(mine.series(`${route}|${cache}`, { route, cache }), value);
  }
  assert.equal(await fast.metrics(), await reference.metrics());
});

test('FastCounter exposes exactly what a prom-client Counter does', { timeout: 5000 }, async () => {
  const reference = new Registry();
  const fast = new Registry();
  const counter = new Counter({ name: 'y_total', help: 'c', labelNames: ['route', 'status'], registers: [reference] });
  const mine = new FastCounter('y_total', 'c', fast);
  for (const [route, status] of [
    ['user', '200'],
    ['user', '200'],
    ['tweet', '404'],
  ] as const) {
    counter.inc({ route, status });
    mine.series(`${route}|${status}`, { route, status }).value++;
  }
  assert.equal(await fast.metrics(), await reference.metrics());
});
