// Live updates: points from a run's `points` events go to every plot that shows their key.
// A chart's first read is downsampled and takes a while; points that arrive meanwhile are held
// and merged once the read has landed, so none is lost between the read and the stream.
// A point of a key no plot shows yet is reported through `onUnknown`: the page then asks the
// server where the key's chart goes and creates it (its read includes the points so far).
//
// What each charted key holds is mirrored in the test hook `window.__trainyard.charts[key]`:
// {points, lastStep, lastValue, paintedAt} (paintedAt: when a frame with its latest points was
// painted, in unix milliseconds, for latency measurements).

export class LiveFeed {
  /** reg: the page's `window.__trainyard` object. */
  constructor(reg) {
    this.reg = reg;
    this.sinks = new Map(); // key -> [fn(point)]
    this.held = new Map(); // key -> Set of arrays, one per read in flight
    this.series = new Map(); // key -> [{chart, series}]
    /** Keys no card will show (past the charts drawn, past a chart's key limit): their
     *  points are not reported through `onUnknown` again. */
    this.ignored = new Set();
    /** Called with the keys of a `points` event that nothing shows. */
    this.onUnknown = null;
    /** Called with (key, step, value) when a key's latest (highest-step) point changes. */
    this.onLatest = null;
  }

  /** Whether some plot shows `key`. */
  shows(key) {
    return this.sinks.has(key) || this.series.has(key);
  }

  /** Calls fn({key, step, value, time}) for every live point of `key`; returns a function
   *  that stops the calls. */
  on(key, fn) {
    if (!this.sinks.has(key)) this.sinks.set(key, []);
    this.sinks.get(key).push(fn);
    return () => {
      const rest = (this.sinks.get(key) ?? []).filter((f) => f !== fn);
      if (rest.length) this.sinks.set(key, rest); else this.sinks.delete(key);
    };
  }

  /** Appends live points of `key` to a chart's series and redraws the chart. */
  attach(key, chart, series) {
    if (!this.series.has(key)) this.series.set(key, []);
    this.series.get(key).push({ chart, series });
  }

  /** Stops feeding `chart` (a card that is being replaced). */
  detach(chart) {
    for (const [key, list] of this.series) {
      const rest = list.filter((e) => e.chart !== chart);
      if (rest.length) this.series.set(key, rest); else this.series.delete(key);
    }
  }

  /**
   * Fills `series` (showing `key`) from `read()`, which resolves to its points; live points of
   * the key that arrive before it resolves are merged on top.
   */
  async load(key, series, read) {
    const held = [];
    if (!this.held.has(key)) this.held.set(key, new Set());
    this.held.get(key).add(held);
    try {
      series.setPoints(await read());
    } finally {
      this.held.get(key).delete(held);
      series.merge(held);
    }
    this.note(key, series);
  }

  /** Routes the points of one `points` event. */
  push(points) {
    this.reg.events += 1;
    const touched = new Set();
    const unknown = new Set();
    for (const p of points) {
      for (const held of this.held.get(p.key) ?? []) held.push(p);
      if (!this.shows(p.key) && !this.ignored.has(p.key)) unknown.add(p.key);
      for (const fn of this.sinks.get(p.key) ?? []) fn(p);
      for (const { chart, series } of this.series.get(p.key) ?? []) {
        if (series.append(p.step, p.value, p.time ?? Date.now())) touched.add(chart);
        this.note(p.key, series);
      }
    }
    for (const c of touched) c.redraw();
    if (unknown.size) this.onUnknown?.([...unknown]);
    // Charts redraw on the next animation frame: stamp the keys once it has been painted.
    const keys = points.map((p) => p.key);
    requestAnimationFrame(() => {
      const now = Date.now();
      for (const k of keys) if (this.reg.charts[k]) this.reg.charts[k].paintedAt = now;
    });
  }

  /** Mirrors what `series` holds for `key` into the test hook and reports a new latest point. */
  note(key, series) {
    const info = this.reg.charts[key] ?? (this.reg.charts[key] = { points: 0, lastStep: -1, lastValue: null });
    info.points = series.n;
    // The latest value is the latest finite one (a NaN is a gap, not a value to show).
    let last = series.n - 1;
    while (last >= 0 && Number.isNaN(series.values[last])) last--;
    if (last < 0) return;
    const step = series.steps[last], value = series.values[last];
    if (step !== info.lastStep || value !== info.lastValue) {
      info.lastStep = step;
      info.lastValue = value;
      this.onLatest?.(key, step, value);
    }
  }
}
