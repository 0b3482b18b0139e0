import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { chromium } from 'playwright-core';
import { ADMIN_KEY, ADMIN_YAML } from './helpers/admin.js';
import { KEY, startPerch, testConfig } from './helpers/perch.js';
import { onCleanup } from './helpers/cleanup.js';

/** Debian's chromium, which .ci/run installs; playwright's own browser downloads are not used. */
const CHROMIUM = '/usr/bin/chromium';
const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'];

test('the status page, in a real browser: asks for the admin key, then shows upstreams and hit ratios', { timeout: 60_000 }, async (t) => {
  if (!existsSync(CHROMIUM)) {
    // .ci/run installs it and sets PERCH_REQUIRE_CHROMIUM, so CI never skips this silently.
    assert.notEqual(process.env.PERCH_REQUIRE_CHROMIUM, '1', `chromium is required but ${CHROMIUM} is missing`);
    t.skip('chromium is not installed (Debian package "chromium"; .ci/run installs it)');
    return;
  }
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }', `${ADMIN_YAML}\n  status_page: true`));
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, timeout: 30_000 });
  onCleanup(t, () => browser.close());
  const page = await browser.newPage();
  page.setDefaultTimeout(15_000);
  // A CSP violation (an inline script or style whose hash does not match) shows up here.
  const problems: string[] = [];
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
  });
  page.on('pageerror', (error) => problems.push(error.message));
  const requested: string[] = [];
  page.on('request', (request) => requested.push(request.url()));

  await page.goto(`${perch.url}/status`);
  assert.equal(await page.locator('#data').isHidden(), true, 'no figures before a key is given');

  // A client key is not an admin key: the form comes back with a message.
  await page.fill('#key', KEY);
  await page.click('button[type=submit]');
  await page.locator('#error', { hasText: 'Not an admin key.' }).waitFor();
  assert.equal(await page.locator('#login').isVisible(), true);

  await page.fill('#key', ADMIN_KEY);
  await page.click('button[type=submit]');
  await page.locator('#upstreams tr[data-name="demo"]').waitFor();
  assert.deepEqual(await page.locator('#upstreams tr[data-name="demo"] td').allTextContents(), ['demo', 'ok', 'closed', '0.0%', '1', '0', '0', '0', '-']);
  assert.equal(await page.locator('#endpoints tr[data-name="user"] td.ratio').textContent(), '50.0%');
  assert.deepEqual(await page.locator('#keys tr[data-name="alpha"] td').allTextContents(), ['alpha', '2', '1', '0', '0', '0', '1', '-']);
  assert.match((await page.locator('#cache tr[data-name="memory"] td').nth(2).textContent()) ?? '', /^2 entries, /);
  assert.equal(await page.locator('#key').inputValue(), '', 'the key does not stay in the form');

  // The next refresh picks up new traffic without another key prompt.
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  await page.locator('#endpoints tr[data-name="user"] td.ratio', { hasText: '66.7%' }).waitFor();

  // Chromium reports the refused key's 401 as a failed load; anything else is a fault of the page.
  assert.deepEqual(
    problems.filter((text) => !text.includes('status of 401')),
    [],
  );
  const origin = new URL(perch.url).origin;
  assert.deepEqual(
    requested.filter((url) => new URL(url).origin !== origin),
    [],
    'the page loads nothing from anywhere else',
  );
  assert.ok(requested.every((url) => !url.includes(ADMIN_KEY)), 'the key never goes into a URL');
});
