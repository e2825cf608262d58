// Screenshot of a --trace-out file in Chromium's own trace viewer, headless: the Performance
// panel of the DevTools bundled with Chromium (devtools://devtools/bundled/trace_app.html), which
// loads Chrome trace event JSON through its "Load profile" file input. Debian's chromium builds
// chrome://tracing without its viewer (catapult is stripped) and Perfetto's UI needs the network,
// so this is the viewer a machine without network has. Not run by CI; docs/observability.md shows
// its output (docs/trace_screenshot.png).
//
//   node scripts/trace_screenshot.mjs TRACE.json OUT.png [SEARCH]
//
// SEARCH (default "MatMul"): the event name searched for and selected, so the Summary pane shows
// its arguments (shapes, format, kernel, bytes, FLOPs). Needs playwright-core as installed under
// tests/e2e/browser/node_modules (scripts/setup.sh) and /usr/bin/chromium (DH_CHROMIUM overrides).
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [trace, out, search = 'MatMul'] = process.argv.slice(2);
if (!trace || !out) {
  console.error('usage: node scripts/trace_screenshot.mjs TRACE.json OUT.png [SEARCH]');
  process.exit(2);
}
const repo = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const require = createRequire(path.join(repo, 'tests/e2e/browser/package.json'));
const { chromium } = require('playwright-core');

const browser = await chromium.launch({
  executablePath: process.env.DH_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
  await page.goto('devtools://devtools/bundled/trace_app.html');
  await page.waitForTimeout(2000);
  await page.keyboard.press('Escape');  // the "debugging connection was closed" notice
  await page.getByText('Performance', { exact: true }).first().click();
  await page.locator('input[type=file]').first().setInputFiles(path.resolve(trace));
  await page.getByText('Keyboard shortcuts for flame chart').waitFor({ timeout: 30000 });
  await page.keyboard.press('Escape');
  await page.getByRole('button', { name: 'Close' }).first().click().catch(() => {});
  await page.mouse.click(16, 39);  // hide the sidebar
  await page.waitForTimeout(500);
  // Expand the process track, then its thread (the flame chart is a canvas: by position).
  await page.mouse.click(10, 129);
  await page.waitForTimeout(300);
  await page.mouse.click(19, 146);
  await page.waitForTimeout(300);
  // Select the first event named SEARCH: the flame chart jumps to it, the Summary shows it.
  await page.keyboard.press('Control+F');
  await page.keyboard.type(search);
  await page.keyboard.press('Enter');
  await page.waitForTimeout(1500);
  // Raise the Summary pane so the selected event's arguments fit.
  await page.mouse.move(640, 489);
  await page.mouse.down();
  await page.mouse.move(640, 290, { steps: 5 });
  await page.mouse.up();
  await page.waitForTimeout(500);
  await page.screenshot({ path: out });
} finally {
  await browser.close();
}
