// memscope's HTML report: draws the data inlined in #memscope-data (schema
// memscope.viewer/1, written by viewer/html_report.cpp) with plain canvas.
// No library, no network: everything the page needs is in the page.
(function () {
  'use strict';

  const DATA = JSON.parse(document.getElementById('memscope-data').textContent);
  const CATS = DATA.categories;
  const MiB = 1048576;
  const CAT_COLORS = {
    PARAMETER: '#4e79a7', OPTIMIZER_STATE: '#f28e2b', INPUT: '#76b7b2', ACTIVATION: '#59a14f',
    GRADIENT: '#e15759', AUTOGRAD_DETAIL: '#b07aa1', TEMPORARY: '#edc948', DDP_BUCKET: '#9c755f',
    COMM_TEMP: '#ff9da7', OTHER: '#8c8c8c',
  };
  // Segment-map kinds after the 10 categories: inactive split, free, pending free.
  const KIND_COLORS = ['#f7c6c6', '#e3e7ed', '#cdb8ea'];
  const KIND_NAMES = DATA.kinds;
  const PHASE_COLORS = {
    model: '#7f8a99', ddp: '#9c755f', zero_grad: '#bab0ac', forward: '#4e79a7', loss: '#f28e2b',
    backward: '#e15759', step: '#59a14f',
  };
  const RESERVED_COLOR = '#1d2430';

  // ---------------------------------------------------------------- text

  // "%.2f" as C prints it: exact halves round to even (toFixed rounds them up).
  function fixed2(x) {
    const y = x * 100, f = Math.floor(y);
    if (y - f === 0.5) return ((f % 2 === 0 ? f : f + 1) / 100).toFixed(2);
    return x.toFixed(2);
  }
  // The same text as memscope's FormatSize (allocator/sizes.cpp).
  function fmtSize(b) {
    if (b <= 1024) return b + ' bytes';
    if (b <= 1048576) return fixed2(b / 1024) + ' KiB';
    if (b <= 1073741824) return fixed2(b / 1048576) + ' MiB';
    return fixed2(b / 1073741824) + ' GiB';
  }
  // One unit per column, so a column reads down without mixing "+64.00 KiB"
  // among MiB: FormatSize's unit for the column's largest value (that value
  // reads as FormatSize prints it), the others in the same unit; a small
  // non-zero value keeps two significant digits instead of "0.00".
  const UNITS = [[1, 'bytes'], [1024, 'KiB'], [1048576, 'MiB'], [1073741824, 'GiB']];
  function unitOf(values) {
    let m = 0;
    for (const v of values) m = Math.max(m, Math.abs(v));
    return UNITS[m <= 1024 ? 0 : m <= 1048576 ? 1 : m <= 1073741824 ? 2 : 3];
  }
  // Two decimals; two significant digits where those would print 0.00.
  function decimals(x) { return x !== 0 && Math.abs(x) < 0.005 ? String(Number(x.toPrecision(2))) : fixed2(x); }
  function fmtIn(b, u) { return u[0] === 1 ? b + ' bytes' : decimals(b / u[0]) + ' ' + u[1]; }
  // A table cell of bytes in its column's unit; the exact bytes on hover.
  function bytesCell(b, u, attrs) {
    return el('td', Object.assign({ text: fmtIn(b, u), title: fmtSize(b) + ' (' + b + ' B)' }, attrs || {}));
  }
  // The phase table's unit, as `memscope summary` prints it: whole MiB, "281M".
  function mib(b) { return Math.floor(b / MiB) + 'M'; }
  // A change in the same unit: whole MiB when it is, else two decimals
  // ("+0.06M", never a "-0M" or a KiB among the M).
  function mibDelta(b) { return b % MiB === 0 ? (b / MiB) + 'M' : decimals(b / MiB) + 'M'; }
  function signed(d, f) { return d > 0 ? '+' + f(d) : d < 0 ? '-' + f(-d) : '0'; }
  function kindName(k) { return k < CATS.length ? CATS[k] : KIND_NAMES[k - CATS.length]; }
  function kindColor(k) { return k < CATS.length ? CAT_COLORS[CATS[k]] : KIND_COLORS[k - CATS.length]; }
  // A phase band's name without its iteration: "forward:3" is "forward".
  function phaseBase(name) { return String(name).split(':')[0]; }
  // The marker of training iteration n (PyTorch's profiler calls it
  // ProfilerStep#n): never "step n", which reads as the optimizer's phase.
  function iterationLabel(n) { return 'iteration ' + n; }
  function phaseColor(name) {
    const base = String(name).split(':')[0];
    return PHASE_COLORS[base] || '#b07aa1';
  }
  // A duration in a unit that suits `span` (both in ns).
  function fmtTime(ns, span) {
    const s = Math.abs(span);
    if (s < 1e4) return ns.toFixed(0) + ' ns';
    if (s < 1e7) return (ns / 1e3).toFixed(s < 1e5 ? 2 : 1) + ' µs';
    if (s < 1e10) return (ns / 1e6).toFixed(s < 1e8 ? 2 : 1) + ' ms';
    return (ns / 1e9).toFixed(s < 1e11 ? 2 : 1) + ' s';
  }
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  }
  function hex(n) { return '0x' + Number(n).toString(16); }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
  }

  // ---------------------------------------------------------------- DOM

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  const tooltip = document.getElementById('tooltip');
  function showTip(html, x, y) {
    tooltip.innerHTML = html;
    tooltip.hidden = false;
    const r = tooltip.getBoundingClientRect();
    let left = x + 14, top = y + 14;
    if (left + r.width > window.innerWidth - 4) left = x - r.width - 14;
    if (top + r.height > window.innerHeight - 4) top = y - r.height - 14;
    tooltip.style.left = Math.max(4, left) + 'px';
    tooltip.style.top = Math.max(4, top) + 'px';
  }
  function hideTip() { tooltip.hidden = true; }

  // A canvas sized to its box, in device pixels. Resizing only when the size
  // changed keeps redraws (hover, zoom) from invalidating the page's layout.
  function fitCanvas(canvas, cssHeight) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, canvas.clientWidth || canvas.parentElement.clientWidth || 600);
    const pw = Math.round(w * dpr), ph = Math.round(cssHeight * dpr);
    if (canvas.width !== pw || canvas.height !== ph) {
      canvas.style.height = cssHeight + 'px';
      canvas.width = pw;
      canvas.height = ph;
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, w, h: cssHeight };
  }

  // First index i with a[i] > x (a sorted).
  function upperBound(a, x) {
    let lo = 0, hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (a[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // ---------------------------------------------------------------- state

  // Per rank: the moment whose segment map is shown, and who redraws on change.
  function RankState(rk) {
    const moments = rk.moments;
    let peak = moments.findIndex((m) => m.key === 'peak');
    if (peak < 0) peak = moments.length - 1;
    const st = { moment: peak, phaseRow: -1, note: '', listeners: [] };
    st.select = function (idx, phaseRow, note) {
      st.moment = idx;
      st.phaseRow = phaseRow === undefined ? -1 : phaseRow;
      st.note = note || '';
      for (const f of st.listeners) f();
    };
    // A phase end: its own segment map, or (long runs keep a subset) the
    // nearest kept moment, said in a note.
    st.selectPhase = function (row) {
      const band = rk.bands[row];
      if (!band) return;
      if (band.moment >= 0) return st.select(band.moment, row);
      let best = -1;
      for (let i = 0; i < moments.length; ++i) {
        if (best < 0 || Math.abs(moments[i].t - band.end) < Math.abs(moments[best].t - band.end)) best = i;
      }
      st.select(best, row, 'no segment map was kept for the end of ' + band.name +
        ' (long run: a subset of phase ends is kept); showing the nearest: ' + momentLabel(moments[best]));
    };
    return st;
  }

  function momentLabel(m) {
    if (m.key === 'peak') return 'peak allocated';
    if (m.key === 'oom') return 'OOM';
    if (m.key === 'end') return 'end (after the last step)';
    if (m.key === 'exit') return 'exit (after teardown)';
    return 'end of ' + m.key;
  }

  // ---------------------------------------------------------------- timeline

  // A run's time axis, shared by its ranks' timelines: one x range (the
  // earliest first event to the latest last event of any rank), one view,
  // so zooming or panning one rank moves them all and a time lines up
  // across ranks.
  function TimeAxis(ranks) {
    let t0 = Infinity, t1 = -Infinity;
    for (const rk of ranks) { t0 = Math.min(t0, rk.t0); t1 = Math.max(t1, rk.t1); }
    if (!isFinite(t0)) { t0 = 0; t1 = 1; }
    if (t1 <= t0) t1 = t0 + 1;
    const axis = { t0, t1, view: { a: t0, b: t1 }, timelines: [] };
    axis.redraw = () => axis.timelines.forEach((f) => f());
    return axis;
  }

  function Timeline(rk, st, yMax, axis) {
    const S = rk.samples;
    const n = S.t.length;
    const cats = CATS.filter((c) => S.by_category[c]);
    // Stack tops: cum[k][i] = sum of the first k+1 present categories at sample i.
    const cum = [];
    for (let k = 0; k < cats.length; ++k) {
      const src = S.by_category[cats[k]];
      const prev = k > 0 ? cum[k - 1] : null;
      const a = new Float64Array(n);
      for (let i = 0; i < n; ++i) a[i] = src[i] + (prev ? prev[i] : 0);
      cum.push(a);
    }
    const t0 = axis.t0, t1 = axis.t1, view = axis.view;
    const rankEnd = rk.t1;  // this rank's last event: its state is drawn up to there
    const maxDepth = rk.bands.reduce((m, b) => Math.max(m, b.depth), 0);
    const bandRows = Math.min(maxDepth + 1, 3);
    const M = { left: 70, right: 14, top: 8 + bandRows * 14, bottom: 24 };
    let hoverX = null, hoverBand = null;
    // Label widths by text (a long run has thousands of bands, a few names).
    const widths = new Map();
    const textWidth = (ctx, text) => {
      if (!widths.has(text)) widths.set(text, ctx.measureText(text).width);
      return widths.get(text);
    };

    const canvas = el('canvas', { class: 'timeline-canvas', 'aria-label': 'memory over time, rank ' + rk.rank });
    const info = el('span', { class: 'view-info' });
    const toolbar = el('div', { class: 'toolbar' },
      el('button', { type: 'button', text: '−', title: 'zoom out', onclick: () => zoom(2, null) }),
      el('button', { type: 'button', text: '+', title: 'zoom in', onclick: () => zoom(0.5, null) }),
      el('button', { type: 'button', text: 'reset', title: 'whole run (or double-click)', onclick: reset }),
      el('span', { text: 'wheel: zoom · drag: pan · click a phase: its segment map' }), info);
    const root = el('div', { class: 'timeline' }, toolbar, canvas);

    function x(t, w) { return M.left + (t - view.a) / (view.b - view.a) * (w - M.left - M.right); }
    function tAt(px, w) { return view.a + (px - M.left) / (w - M.left - M.right) * (view.b - view.a); }
    function y(v, h) { return h - M.bottom - v / yMax * (h - M.bottom - M.top); }

    function stepPath(ctx, values, w, h, close) {
      const i0 = Math.max(0, upperBound(S.t, view.a) - 1);
      const i1 = Math.min(n - 1, upperBound(S.t, view.b));
      const xEnd = Math.max(M.left, Math.min(x(Math.min(view.b, Math.max(rankEnd, S.t[i1] || t0)), w), w - M.right));
      const base = y(0, h);
      ctx.beginPath();
      let started = false, prev = 0, lastPx = -1, lastY = 0;
      for (let i = i0; i <= i1; ++i) {
        const px = Math.max(M.left, Math.min(x(S.t[i], w), w - M.right));
        const py = y(values[i], h);
        if (!started) {
          ctx.moveTo(px, close ? base : py);
          if (close) ctx.lineTo(px, S.t[i] <= view.a ? py : base);
          started = true;
        } else if (px - lastPx >= 0.25 || i === i1) {
          ctx.lineTo(px, y(prev, h));
          lastPx = px;
        }
        ctx.lineTo(px, py);
        prev = values[i];
        lastY = py;
      }
      if (!started) return;
      ctx.lineTo(xEnd, lastY);
      if (close) {
        ctx.lineTo(xEnd, base);
        ctx.closePath();
      }
    }

    function draw() {
      const { ctx, w, h } = fitCanvas(canvas, 300);
      ctx.clearRect(0, 0, w, h);
      ctx.font = '11px system-ui, sans-serif';
      const plotTop = M.top, plotBottom = h - M.bottom;
      // Axes and grid.
      const unit = yMax >= 2 * 1073741824 ? [1073741824, 'GiB'] : yMax >= 2 * MiB ? [MiB, 'MiB'] :
        yMax >= 2048 ? [1024, 'KiB'] : [1, 'B'];
      const step = niceStep(yMax / unit[0] / 5) * unit[0];
      ctx.strokeStyle = '#e8ebf0';
      ctx.fillStyle = '#5b6575';
      ctx.textAlign = 'right';
      ctx.textBaseline = 'middle';
      for (let v = 0; v <= yMax * 1.0001; v += step) {
        const py = y(v, h);
        ctx.beginPath(); ctx.moveTo(M.left, py); ctx.lineTo(w - M.right, py); ctx.stroke();
        ctx.fillText(+(v / unit[0]).toFixed(2) + ' ' + unit[1], M.left - 6, py);
      }
      // Time axis.
      const span = view.b - view.a;
      const tstep = niceStep(span / Math.max(2, Math.floor((w - M.left - M.right) / 110)));
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      for (let t = Math.ceil((view.a - t0) / tstep) * tstep; t0 + t <= view.b; t += tstep) {
        const px = x(t0 + t, w);
        ctx.beginPath(); ctx.moveTo(px, plotBottom); ctx.lineTo(px, plotBottom + 4); ctx.stroke();
        ctx.fillText(fmtTime(t, span), px, plotBottom + 6);
      }
      ctx.save();
      ctx.beginPath();
      ctx.rect(M.left, 0, w - M.left - M.right, h);
      ctx.clip();
      // Phase bands: tinted plot background (outermost phases) and a strip on top.
      // Each band is labelled with its phase (the iteration is the marker's):
      // "forward" where it fits, its first letter where that fits, else it
      // is at least 2 px wide and named on hover (bandsNear).
      const labelled = [];
      for (const b of rk.bands) {
        if (b.end < view.a || b.begin > view.b) continue;
        const xa = x(b.begin, w), xb = x(b.end, w);
        if (b.depth === 0 && xb - xa >= 0.5) {
          ctx.globalAlpha = 0.08;
          ctx.fillStyle = phaseColor(b.name);
          ctx.fillRect(xa, plotTop, xb - xa, plotBottom - plotTop);
        }
        if (b.depth < bandRows) {
          const by = 4 + b.depth * 14;
          ctx.globalAlpha = b.moment >= 0 && rk.moments[st.moment] === rk.moments[b.moment] ? 1 : 0.75;
          ctx.fillStyle = phaseColor(b.name);
          ctx.fillRect(xa, by, Math.max(2, xb - xa - 1), 12);
          ctx.globalAlpha = 1;
          if (b === hoverBand) {
            ctx.strokeStyle = '#1d2430';
            ctx.strokeRect(xa - 0.5, by - 0.5, Math.max(2, xb - xa - 1) + 1, 13);
          }
          const base = phaseBase(b.name);
          const label = xb - xa > textWidth(ctx, base) + 6 ? base : xb - xa > textWidth(ctx, base[0]) + 4 ? base[0] : '';
          if (label) {
            ctx.fillStyle = '#fff';
            ctx.textAlign = 'left';
            ctx.textBaseline = 'middle';
            ctx.fillText(label, xa + (label === base ? 3 : 2), by + 6.5);
            if (labelled.length < 400) labelled.push([rk.bands.indexOf(b), label]);
          }
        }
      }
      canvas.dataset.bandLabels = JSON.stringify(labelled);
      ctx.globalAlpha = 1;
      // Stacked categories (the top edge is allocated), then reserved over them.
      for (let k = cats.length - 1; k >= 0; --k) {
        stepPath(ctx, cum[k], w, h, true);
        ctx.fillStyle = CAT_COLORS[cats[k]];
        ctx.fill();
      }
      stepPath(ctx, S.reserved, w, h, false);
      ctx.strokeStyle = RESERVED_COLOR;
      ctx.lineWidth = 1.5;
      ctx.stroke();
      ctx.lineWidth = 1;
      // Iterations: a dashed line where each training iteration's first phase
      // begins, "iteration N", named apart from the optimizer's phase "step".
      let lastLabel = -1e9;
      const stepLabels = [];
      ctx.setLineDash([3, 3]);
      for (const s of rk.steps) {
        if (s.t < view.a || s.t > view.b) continue;
        const px = x(s.t, w);
        ctx.strokeStyle = 'rgba(29,36,48,0.45)';
        ctx.beginPath(); ctx.moveTo(px, plotTop); ctx.lineTo(px, plotBottom); ctx.stroke();
        const label = iterationLabel(s.step);
        if (px - lastLabel > ctx.measureText(label).width + 10) {
          ctx.fillStyle = '#1d2430';
          ctx.textAlign = 'left';
          ctx.textBaseline = 'top';
          ctx.fillText(label, px + 3, plotTop + 2);
          lastLabel = px;
          if (stepLabels.length < 200) stepLabels.push(label);
        }
      }
      ctx.setLineDash([]);
      canvas.dataset.iterationLabels = JSON.stringify(stepLabels);
      // Selected moment.
      const m = rk.moments[st.moment];
      if (m && m.t >= view.a && m.t <= view.b) {
        const px = x(m.t, w);
        ctx.strokeStyle = '#2457c5';
        ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(px, plotTop); ctx.lineTo(px, plotBottom); ctx.stroke();
        ctx.lineWidth = 1;
      }
      // Peaks and OOM.
      const rep = rk.report;
      const marker = (t, v, color, label, above) => {
        if (t < view.a || t > view.b) return;
        const px = x(t, w), py = y(v, h);
        ctx.fillStyle = color;
        ctx.beginPath(); ctx.arc(px, py, 4, 0, 2 * Math.PI); ctx.fill();
        ctx.textAlign = px > w - 180 ? 'right' : 'left';
        ctx.textBaseline = above ? 'bottom' : 'top';
        ctx.font = 'bold 11px system-ui, sans-serif';
        ctx.fillText(label, px + (px > w - 180 ? -7 : 7), py + (above ? -3 : 3));
        ctx.font = '11px system-ui, sans-serif';
      };
      marker(rk.peak_reserved_t, rep.peak.reserved.bytes, RESERVED_COLOR,
        'peak reserved ' + fmtSize(rep.peak.reserved.bytes), true);
      marker(rk.peak_allocated_t, rep.peak.allocated.bytes, '#a1400b',
        'peak allocated ' + fmtSize(rep.peak.allocated.bytes), false);
      if (rk.oom_t !== null && rk.oom_t >= view.a && rk.oom_t <= view.b) {
        const px = x(rk.oom_t, w);
        ctx.strokeStyle = '#c8102e';
        ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(px, plotTop); ctx.lineTo(px, plotBottom); ctx.stroke();
        ctx.lineWidth = 1;
        ctx.fillStyle = '#c8102e';
        ctx.textAlign = 'right';
        ctx.textBaseline = 'top';
        ctx.font = 'bold 12px system-ui, sans-serif';
        ctx.fillText('OOM', px - 4, plotTop + 14);
      }
      if (hoverX !== null) {
        ctx.strokeStyle = 'rgba(0,0,0,0.35)';
        ctx.beginPath(); ctx.moveTo(hoverX, plotTop); ctx.lineTo(hoverX, plotBottom); ctx.stroke();
      }
      ctx.restore();
      ctx.strokeStyle = '#9aa3b0';
      ctx.beginPath(); ctx.moveTo(M.left, plotTop); ctx.lineTo(M.left, plotBottom); ctx.lineTo(w - M.right, plotBottom);
      ctx.stroke();
      const i0 = Math.max(0, upperBound(S.t, view.a) - 1), i1 = Math.min(n, upperBound(S.t, view.b) + 1);
      canvas.dataset.drawnSamples = String(Math.max(0, i1 - i0));
      canvas.dataset.axisStart = String(t0);
      canvas.dataset.axisEnd = String(t1);
      canvas.dataset.viewStart = String(view.a);
      canvas.dataset.viewEnd = String(view.b);
      info.textContent = ' · ' + fmtTime(view.a - t0, span) + ' – ' + fmtTime(view.b - t0, span) + ' · ' +
        (rk.thinned ? n + ' of ' + rk.samples_total + ' samples drawn (thinned, peaks kept)'
          : n + ' samples');
    }

    // A redraw on the next frame: this rank's (hover), or every rank's (the
    // shared view moved).
    let frame = 0, frameAll = false;
    function scheduleDraw(all) {
      frameAll = frameAll || !!all;
      if (frame) return;
      frame = requestAnimationFrame(() => {
        frame = 0;
        const everyRank = frameAll;
        frameAll = false;
        if (everyRank) axis.redraw(); else draw();
      });
    }

    function clampView() {
      const full = t1 - t0;
      let len = Math.min(full, Math.max(view.b - view.a, Math.max(1, full / 1e6)));
      let a = Math.max(t0, Math.min(view.a, t1 - len));
      view.a = a;
      view.b = a + len;
    }
    function zoom(factor, center) {
      const c = center === null ? (view.a + view.b) / 2 : center;
      view.a = c - (c - view.a) * factor;
      view.b = c + (view.b - c) * factor;
      clampView();
      axis.redraw();
    }
    function reset() { view.a = t0; view.b = t1; axis.redraw(); }

    // The phase bands of the band strip's row under (px, py) within 4 px,
    // nearest first: a phase a pixel wide (loss, step) is still hovered and
    // clicked, and phases crowded into a few pixels are all named.
    function bandsNear(px, py, w) {
      const depth = Math.floor((py - 4) / 14);
      if (py < 2 || depth < 0 || depth >= bandRows || py > M.top) return [];
      const near = [];
      for (const b of rk.bands) {
        if (b.depth !== depth || b.end < view.a || b.begin > view.b) continue;
        const xa = x(b.begin, w), xb = Math.max(x(b.end, w), xa + 2);
        const dist = px < xa ? xa - px : px > xb ? px - xb : 0;
        if (dist <= 4) near.push([dist, Math.abs(px - (xa + xb) / 2), b]);
      }
      near.sort((p, q) => p[0] - q[0] || p[1] - q[1]);
      return near.map((n) => n[2]);
    }
    // A phase band's hover: its name as the phase table has it, which
    // iteration it belongs to, when and how long; then the others as close.
    function bandHtml(near) {
      const b = near[0];
      const row = rk.report.phases[rk.bands.indexOf(b)];
      const step = row && row.step !== null && row.step !== undefined ? row.step : null;
      let html = '<b>phase ' + escapeHtml(b.name) + '</b>' +
        (step !== null ? ' · ' + escapeHtml(phaseBase(b.name)) + ' of iteration ' + step : '') +
        '<br>' + fmtTime(b.begin - t0, view.b - view.a) + ' – ' + fmtTime(b.end - t0, view.b - view.a) +
        ' (' + fmtTime(b.end - b.begin, b.end - b.begin) + ')' +
        (row ? '<br>allocated after it ' + fmtSize(row.allocated_bytes) + ', reserved ' +
          fmtSize(row.reserved_bytes) : '');
      if (near.length > 1) {
        html += '<br>also within 4 px: ' + escapeHtml(near.slice(1, 9).map((o) => o.name).join(', ')) +
          (near.length > 9 ? ', …' : '') + ' (zoom in to tell them apart)';
      }
      return html + '<br><i>click: its segment map</i>';
    }

    // Phases open at t, outermost first.
    function phasesAt(t) {
      const open = rk.bands.filter((b) => b.begin <= t && t <= b.end);
      open.sort((p, q) => p.depth - q.depth);
      return open;
    }
    function hoverHtml(t) {
      const i = upperBound(S.t, t) - 1;
      const phases = phasesAt(t);
      let html = '<b>' + fmtTime(t - t0, view.b - view.a) + '</b>';
      html += phases.length ? ' · ' + escapeHtml(phases.map((b) => b.name).join(' › ')) : '';
      html += '<table>';
      const unit = unitOf([i >= 0 ? S.reserved[i] : 0, i >= 0 ? S.allocated[i] : 0]);
      const row = (name, v, color) => '<tr><td>' + (color ? '<span class="swatch" style="background:' + color +
        '"></span> ' : '') + escapeHtml(name) + '</td><td>' + fmtIn(v, unit) + '</td></tr>';
      html += row('reserved', i >= 0 ? S.reserved[i] : 0, null);
      html += row('allocated', i >= 0 ? S.allocated[i] : 0, null);
      for (let k = cats.length - 1; k >= 0; --k) {
        const v = i >= 0 ? S.by_category[cats[k]][i] : 0;
        if (v > 0) html += row(cats[k], v, CAT_COLORS[cats[k]]);
      }
      return html + '</table>';
    }

    let drag = null;
    canvas.addEventListener('mousedown', (e) => {
      drag = { x: e.clientX, a: view.a, b: view.b, moved: false };
    });
    window.addEventListener('mouseup', (e) => {
      if (!drag) return;
      const wasClick = !drag.moved;
      drag = null;
      if (!wasClick || e.target !== canvas) return;
      const r = canvas.getBoundingClientRect();
      const near = bandsNear(e.clientX - r.left, e.clientY - r.top, r.width);
      if (near.length) return st.selectPhase(rk.bands.indexOf(near[0]));
      const t = tAt(e.clientX - r.left, r.width);
      const open = phasesAt(t);
      if (!open.length) return;
      // Click in the band strip: that row's phase; in the plot: the innermost phase.
      const depth = Math.floor((e.clientY - r.top - 4) / 14);
      const hit = open.find((b) => b.depth === depth) || open[open.length - 1];
      st.selectPhase(rk.bands.indexOf(hit));
    });
    canvas.addEventListener('mousemove', (e) => {
      const r = canvas.getBoundingClientRect();
      if (drag) {
        const dx = e.clientX - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          const dt = dx / (r.width - M.left - M.right) * (drag.b - drag.a);
          view.a = drag.a - dt;
          view.b = drag.b - dt;
          clampView();
        }
      }
      const panned = !!(drag && drag.moved);
      const px = e.clientX - r.left;
      if (px < M.left || px > r.width - M.right) {
        hoverX = null;
        hideTip();
      } else {
        hoverX = px;
        const near = bandsNear(px, e.clientY - r.top, r.width);
        hoverBand = near.length ? near[0] : null;
        showTip(near.length ? bandHtml(near) : hoverHtml(tAt(px, r.width)), e.clientX, e.clientY);
      }
      scheduleDraw(panned);
    });
    canvas.addEventListener('mouseleave', () => { hoverX = null; hoverBand = null; hideTip(); draw(); });
    canvas.addEventListener('wheel', (e) => {
      e.preventDefault();
      const r = canvas.getBoundingClientRect();
      zoom(e.deltaY > 0 ? 1.25 : 0.8, tAt(e.clientX - r.left, r.width));
    }, { passive: false });
    canvas.addEventListener('dblclick', reset);

    const legend = el('div', { class: 'legend' },
      el('span', {}, el('span', { class: 'swatch line', style: 'background:' + RESERVED_COLOR }), 'reserved'),
      ...cats.map((c) => el('span', {}, el('span', { class: 'swatch', style: 'background:' + CAT_COLORS[c] }), c)));
    root.append(legend);
    st.listeners.push(draw);
    return { root, draw };
  }

  // ---------------------------------------------------------------- phase table

  function PhaseTable(rk, st) {
    const rows = rk.report.phases;
    const deltas = rows.map((p, i) => p.allocated_bytes - (i > 0 ? rows[i - 1].allocated_bytes : 0));
    // The largest phase-to-phase jumps of allocated (at most 3, non-zero).
    const jumps = new Set(deltas.map((d, i) => [Math.abs(d), i]).filter((p) => p[0] > 0)
      .sort((p, q) => q[0] - p[0] || p[1] - q[1]).slice(0, 3).map((p) => p[1]));
    const body = el('tbody');
    const trs = rows.map((p, i) => {
      const d = deltas[i];
      const tr = el('tr', {
        'data-row': i, 'data-phase': rk.bands[i] ? rk.bands[i].name : '',
        class: jumps.has(i) ? 'jump' : null,
        title: jumps.has(i) ? 'one of the largest phase-to-phase jumps of allocated (' + signed(d, fmtSize) + ')'
          : 'click: segment map at the end of this phase',
        onclick: () => st.selectPhase(i),
      },
      el('td', { class: 'name', text: p.step === null ? '-' : String(p.step) }),
      el('td', { class: 'name', text: p.phase }),
      el('td', { text: mib(p.allocated_bytes) }),
      el('td', { text: mib(p.max_allocated_bytes) }),
      el('td', { text: mib(p.reserved_bytes) }),
      el('td', { text: mib(p.max_reserved_bytes) }),
      el('td', { text: mib(p.peak_allocated_bytes_in_phase) }),
      el('td', { class: 'delta ' + (d > 0 ? 'up' : d < 0 ? 'down' : ''), text: signed(d, mibDelta) }));
      body.append(tr);
      return tr;
    });
    const head = el('thead', {}, el('tr', {},
      ...['iteration', 'phase', 'allocated', 'max allocated', 'reserved', 'max reserved', 'peak in phase', 'Δ allocated']
        .map((h, k) => el('th', { class: k < 2 ? 'name' : null, text: h }))));
    const table = el('table', { class: 'phases' }, head, body);
    const wrap = el('div', { class: 'table-wrap' }, table);
    const root = el('div', { class: 'phase-panel' },
      el('h3', { text: 'Phases (MiB, after each phase; highlighted: the largest jumps of allocated)' }),
      rows.length ? wrap : el('p', { class: 'note', text: 'This recording has no phase marks.' }));
    function update() {
      let sel = st.phaseRow;
      if (sel < 0) sel = rk.bands.findIndex((b) => b.moment === st.moment);
      trs.forEach((tr, i) => tr.classList.toggle('selected', i === sel));
    }
    st.listeners.push(update);
    update();
    return { root };
  }

  // ---------------------------------------------------------------- segment map

  // How many rows the segment map shows before it aggregates (its box holds
  // them without scrolling), and the narrowest bar drawn for one segment.
  const SEG_MAX_ROWS = 24, SEG_MIN_BAR_PX = 4;

  // The rows of a segment map for `segs` (bars of width barMax at `scale`
  // bytes): one per segment, in address order, while they fit and none is a
  // sliver. Otherwise the largest segments (at least SEG_MIN_BAR_PX wide, at
  // most SEG_MAX_ROWS - 2 of them) keep their rows and the rest are
  // aggregated, one row per pool: their bytes by kind, a bar that zooms in
  // (its segments, laid out the same way at their own scale) when clicked.
  function segmentRows(segs, scale, barMax) {
    const wide = (s) => s.size / scale * barMax >= SEG_MIN_BAR_PX;
    const bySize = segs.slice().sort((p, q) => q.size - p.size || p.addr - q.addr);
    let keep = 0;
    while (keep < bySize.length && keep < SEG_MAX_ROWS - 2 && wide(bySize[keep])) ++keep;
    const rest = bySize.slice(keep);
    if (rest.length < 2 && segs.length <= SEG_MAX_ROWS) return segs.map((s) => ({ seg: s }));
    const rows = bySize.slice(0, keep).sort((p, q) => p.addr - q.addr).map((s) => ({ seg: s }));
    const pools = [...new Set(rest.map((s) => s.pool))];
    const groups = pools.length <= 2 ? pools.map((p) => rest.filter((s) => s.pool === p)) : [rest];
    for (const g of groups) {
      const kinds = new Map();
      let size = 0;
      for (const s of g) {
        size += s.size;
        for (const b of s.blocks) kinds.set(b[2], (kinds.get(b[2]) || 0) + b[1]);
      }
      rows.push({ group: g.sort((p, q) => p.addr - q.addr), size, kinds: [...kinds].sort((p, q) => p[0] - q[0]),
        pool: pools.length <= 2 ? g[0].pool : 'all', largest: g.reduce((a, s) => Math.max(a, s.size), 0) });
    }
    return rows;
  }

  function SegmentMap(rk, st) {
    const moments = rk.moments;
    const order = [];
    moments.forEach((m, i) => { if (m.key === 'peak' || m.key === 'oom') order.push(i); });
    moments.forEach((m, i) => { if (m.key !== 'peak' && m.key !== 'oom') order.push(i); });
    const select = el('select', { 'aria-label': 'moment', onchange: () => st.select(Number(select.value)) },
      ...order.map((i) => el('option', { value: i, text: momentLabel(moments[i]) })));
    // One scale for every moment's map (switching moments compares by eye).
    let maxSize = 1;
    for (const m of moments) for (const s of m.segments) maxSize = Math.max(maxSize, s.size);
    const canvas = el('canvas', { class: 'segmap-canvas' });
    const scroll = el('div', { class: 'segscroll' }, canvas);
    const frag = el('dl', { class: 'frag' });
    const note = el('p', { class: 'note' });
    const title = el('h3');
    // Zoom into aggregated rows: the stack of groups opened (empty: the
    // moment's whole map), cleared when the moment changes.
    let zoom = [], zoomMoment = -1, rows = [];
    const back = el('button', { type: 'button', class: 'segback', hidden: true,
      text: '◂ all segments', title: 'back to the whole segment map',
      onclick: () => { zoom.pop(); draw(); } });
    const legendKinds = [];
    const present = new Set();
    for (const m of moments) for (const s of m.segments) for (const b of s.blocks) present.add(b[2]);
    for (let k = 0; k < CATS.length + KIND_NAMES.length; ++k) if (present.has(k)) legendKinds.push(k);
    const legend = el('div', { class: 'legend' }, ...legendKinds.map((k) =>
      el('span', {}, el('span', { class: 'swatch', style: 'background:' + kindColor(k) }), kindName(k))));
    const root = el('div', { class: 'segpanel' }, title, el('div', { class: 'segtools' }, select, back),
      el('div', { class: 'segbody' }, scroll, frag), legend, note);
    const ROW = 16, LABEL = 150;
    const groupLabel = (r, unit) => '▸ ' + r.group.length + ' ' + (r.pool === 'all' ? '' : r.pool + ' ') + '≤ ' +
      fmtIn(r.largest, unit);

    function draw() {
      const m = moments[st.moment];
      if (!m) return;
      if (zoomMoment !== st.moment) { zoom = []; zoomMoment = st.moment; }
      select.value = String(st.moment);
      root.dataset.moment = m.key;
      root.dataset.segments = String(m.segments.length);
      root.dataset.zoom = String(zoom.length);
      back.hidden = zoom.length === 0;
      const segs = zoom.length ? zoom[zoom.length - 1] : m.segments;
      title.textContent = 'Segment map at ' + momentLabel(m) + ' (' + m.segments.length + ' segment' +
        (m.segments.length === 1 ? '' : 's') + (zoom.length ? '; zoomed into ' + segs.length : '') + ')';
      const w0 = Math.max(200, canvas.clientWidth || scroll.clientWidth || 600);
      const scale = zoom.length ? segs.reduce((a, s) => Math.max(a, s.size), 1) : maxSize;
      rows = segmentRows(segs, scale, w0 - LABEL - 6);
      const { ctx, w, h } = fitCanvas(canvas, Math.max(ROW * rows.length + 4, 24));
      ctx.clearRect(0, 0, w, h);
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'middle';
      const barMax = w - LABEL - 6;
      // The label column in one unit: that of the largest segment.
      const unit = unitOf(segs.map((s) => s.size));
      const drawn = [];
      rows.forEach((row, r) => {
        const yy = 2 + r * ROW;
        ctx.fillStyle = '#5b6575';
        ctx.textAlign = 'right';
        if (row.group) {
          ctx.fillText(groupLabel(row, unit), LABEL - 6, yy + ROW / 2);
          // The group's bytes by kind, the whole bar its total.
          let bx = LABEL;
          for (const [k, bytes] of row.kinds) {
            const bw = bytes / row.size * barMax;
            ctx.fillStyle = kindColor(k);
            ctx.fillRect(bx, yy + 1, Math.max(0.6, bw), ROW - 3);
            bx += bw;
          }
          ctx.setLineDash([3, 2]);
          ctx.strokeStyle = '#5b6575';
          ctx.strokeRect(LABEL + 0.5, yy + 1.5, barMax - 1, ROW - 4);
          ctx.setLineDash([]);
          drawn.push({ segments: row.group.length, width: barMax, group: true });
          return;
        }
        const s = row.seg;
        ctx.fillText(fmtIn(s.size, unit) + ' ' + s.pool + (s.stream ? ' s' + s.stream : '') +
          (s.expandable ? ' exp' : ''), LABEL - 6, yy + ROW / 2);
        const width = Math.max(2, s.size / scale * barMax);
        for (const b of s.blocks) {
          const bx = LABEL + b[0] / s.size * width;
          const bw = Math.max(0.6, b[1] / s.size * width);
          ctx.fillStyle = kindColor(b[2]);
          ctx.fillRect(bx, yy + 1, bw, ROW - 3);
          if (bw > 4) {
            ctx.fillStyle = '#fff';
            ctx.fillRect(bx, yy + 1, 1, ROW - 3);
          }
        }
        ctx.strokeStyle = '#9aa3b0';
        ctx.strokeRect(LABEL + 0.5, yy + 1.5, width - 1, ROW - 4);
        drawn.push({ segments: 1, width, group: false });
      });
      canvas.dataset.rows = JSON.stringify(drawn);
      const f = m.fragmentation;
      frag.replaceChildren();
      const fu = unitOf([f.reserved_bytes, f.allocated_bytes, f.reserved_minus_allocated_bytes,
        f.free_in_segments_bytes, f.largest_free_block_bytes, f.inactive_split_bytes]);
      const item = (k, v, key, bytes) => frag.append(el('dt', { text: k }), el('dd', { 'data-key': key, text: v,
        title: bytes === undefined ? null : fmtSize(bytes) + ' (' + bytes + ' B)' }));
      const bytesItem = (k, b, key) => item(k, fmtIn(b, fu), key, b);
      bytesItem('reserved', f.reserved_bytes, 'reserved_bytes');
      bytesItem('allocated', f.allocated_bytes, 'allocated_bytes');
      bytesItem('reserved − allocated', f.reserved_minus_allocated_bytes, 'reserved_minus_allocated_bytes');
      bytesItem('free in segments', f.free_in_segments_bytes, 'free_in_segments_bytes');
      bytesItem('largest free block', f.largest_free_block_bytes, 'largest_free_block_bytes');
      item('fragmentation', f.fragmentation.toFixed(3), 'fragmentation');
      bytesItem('inactive split', f.inactive_split_bytes, 'inactive_split_bytes');
      item('segments', String(f.segments), 'segments');
      item('free blocks', String(f.free_blocks), 'free_blocks');
      const notes = [];
      if (st.note) notes.push(st.note);
      if (m.segments_total > m.segments.length) {
        notes.push('the ' + m.segments.length + ' largest of ' + m.segments_total + ' segments are drawn');
      }
      if (rows.some((r) => r.group)) {
        notes.push('▸ rows: smaller segments together, their bytes by kind (click: zoom in)');
      }
      if (m.segments.some((s) => s.merged)) notes.push('segments with many blocks are drawn in slices');
      notes.push('fragmentation = 1 − largest free block / free in segments');
      note.textContent = notes.join('; ');
    }
    function rowAt(e) {
      const r = canvas.getBoundingClientRect();
      return { row: rows[Math.floor((e.clientY - r.top - 2) / ROW)], r };
    }
    canvas.addEventListener('mousemove', (e) => {
      const { row, r } = rowAt(e);
      if (!row) return hideTip();
      canvas.style.cursor = row.group ? 'zoom-in' : '';
      if (row.group) {
        let html = '<b>' + row.group.length + ' segments' + (row.pool === 'all' ? '' : ', ' + row.pool + ' pool') +
          '</b> · ' + fmtSize(row.size) + ' in all, the largest ' + fmtSize(row.largest) + '<table>';
        for (const [k, bytes] of row.kinds) {
          html += '<tr><td><span class="swatch" style="background:' + kindColor(k) + '"></span> ' +
            escapeHtml(kindName(k)) + '</td><td>' + fmtIn(bytes, unitOf([row.size])) + '</td></tr>';
        }
        return showTip(html + '</table><i>click: zoom into these segments</i>', e.clientX, e.clientY);
      }
      const s = row.seg;
      const segs = zoom.length ? zoom[zoom.length - 1] : moments[st.moment].segments;
      const scale = zoom.length ? segs.reduce((a, q) => Math.max(a, q.size), 1) : maxSize;
      const width = Math.max(2, s.size / scale * (r.width - LABEL - 6));
      const off = (e.clientX - r.left - LABEL) / width * s.size;
      const b = s.blocks.find((bb) => off >= bb[0] && off < bb[0] + bb[1]);
      let html = '<b>segment ' + hex(s.addr) + '</b> · ' + fmtSize(s.size) + ', ' + s.pool + ' pool, stream ' +
        s.stream + (s.expandable ? ', expandable' : '');
      if (b) {
        html += '<br>' + escapeHtml(kindName(b[2])) + ': ' + fmtSize(b[1]) + ' at +' + hex(b[0]) +
          (b[3] ? ' · ' + escapeHtml(rk.owners[b[3]]) : '');
      }
      showTip(html, e.clientX, e.clientY);
    });
    canvas.addEventListener('click', (e) => {
      const { row } = rowAt(e);
      if (!row || !row.group) return;
      zoom.push(row.group);
      hideTip();
      draw();
    });
    canvas.addEventListener('mouseleave', hideTip);
    st.listeners.push(draw);
    return { root, draw };
  }

  // ---------------------------------------------------------------- allocation sites

  // The top allocation sites (bytes by stack, like memray's table): at the
  // peak and at an OOM. A site is an imported allocation's stack (the user's
  // frames, innermost first) or, for memscope's own runs, category and owner.
  function SitesTable(title, sites, key) {
    const unit = unitOf(sites.map((s) => s.bytes));
    const body = el('tbody', {}, ...sites.map((s) => el('tr', {},
      bytesCell(s.bytes, unit), el('td', { text: String(s.allocations) }),
      el('td', { class: 'name site', text: s.site, title: s.site.split(' <- ').join('\n') }))));
    const head = el('thead', {}, el('tr', {}, el('th', { text: 'bytes' }), el('th', { text: 'allocations' }),
      el('th', { class: 'name', text: 'site' })));
    return el('div', { class: 'sites', 'data-key': key }, el('h3', { text: title }),
      el('div', { class: 'table-wrap' }, el('table', { class: 'sites' }, head, body)));
  }

  // ---------------------------------------------------------------- explain

  // `memscope explain` of the run: the diagnosis lines, then each what-if (a
  // replay of the same requests with one change) with its result, its peak
  // reserved, the smallest GPU that runs it and the bytes it saves.
  function ExplainView(x) {
    const head = el('tr', {}, ...['change', 'result', 'peak reserved', 'min memory', 'saved']
      .map((t) => el('th', { text: t })));
    const size = (b) => (b === null ? 'over 1 TiB' : fmtSize(b));
    const saved = (b) => (b === null ? '-' : (b >= 0 ? fmtSize(b) + ' less' : fmtSize(-b) + ' more'));
    const row = (change, oom, reserved, min, s) => el('tr', {},
      el('td', { text: change }), el('td', { text: oom === null ? 'ok' : 'OOM at request ' + (oom + 1) }),
      el('td', { text: fmtSize(reserved) }), el('td', { text: size(min) }), el('td', { text: s }));
    const rows = [row((x.alloc_conf || '(defaults)') + ' as recorded', x.oom ? x.oom.request_index : null,
      x.peak_reserved_bytes, x.min_device_memory, '-')];
    for (const w of x.what_ifs) {
      rows.push(row(w.change, w.oom_request_index, w.peak_reserved_bytes, w.min_device_memory, saved(w.saved_bytes)));
    }
    return el('div', { class: 'explain' },
      el('h3', { text: x.oom ? 'Why it ran out of memory' : 'Peak and headroom' }),
      ...x.diagnosis.map((line) => el('p', { class: 'diagnosis', text: line })),
      el('div', { class: 'table-wrap' }, el('table', { class: 'explain' }, head, el('tbody', {}, ...rows))),
      ...TrainingView(x));
  }

  // The training-side changes of a run memscope simulated (`memscope plan`'s
  // strategies at the run's batch), as `memscope explain` prints them; for
  // other recordings the one line that says why there are none.
  function TrainingView(x) {
    if (!x.training) return x.training_note ? [el('p', { class: 'training-note', text: 'training-side changes: ' + x.training_note })] : [];
    const t = x.training;
    const head = el('tr', {}, ...['strategy', 'batch', 'peak reserved', 'saved'].map((h) => el('th', { text: h })));
    const rows = t.rows.map((c) => {
      const batch = c.error ? 'error' : (c.fits ? c.max_batch + ' fits' : (c.max_batch > 0 ? 'only ' + c.max_batch : 'OOM'));
      const saved = c.error ? c.error : (c.saved_bytes === null ? '-'
        : (c.saved_bytes >= 0 ? fmtSize(c.saved_bytes) + ' less' : fmtSize(-c.saved_bytes) + ' more'));
      return el('tr', { class: c.own ? 'own' : '' }, el('td', { text: c.strategy + (c.own ? " (the run's)" : '') }),
        el('td', { text: batch }), el('td', { text: c.peak_reserved_bytes === null ? '-' : fmtSize(c.peak_reserved_bytes) }),
        el('td', { text: saved }));
    });
    return [el('h3', { text: 'Training-side changes' }),
      el('p', { class: 'training-plan', text: 'The memscope plan strategies at the run\'s batch of ' + t.batch_size +
        ' per rank on its ' + fmtSize(t.device_memory) + ' (' + t.command + ')' }),
      el('div', { class: 'table-wrap' }, el('table', { class: 'training' }, head, el('tbody', {}, ...rows)))];
  }

  // ---------------------------------------------------------------- the whole GPU

  // The run's GPU table (report.json "gpus"), as nvidia-smi lists processes:
  // per physical GPU, each process's context + peak reserved + NCCL = used,
  // then the GPU's total against its capacity. Each byte cell carries its
  // exact value in data-bytes.
  // A capture with --all-device-memory (capture.md) has measured rows
  // ("source": "measured"): then a source column and cuBLAS, cuDNN and other.
  function GpuTable(gpus) {
    // Each column in one unit: that of its largest value.
    const units = {};
    for (const g of gpus) {
      const col = (key, b) => { (units[key] = units[key] || []).push(b || 0); };
      for (const p of g.processes) {
        col('context', p.context_bytes); col('reserved', p.reserved_bytes); col('nccl', p.nccl_bytes);
        col('cublas', p.cublas_bytes); col('cudnn', p.cudnn_bytes); col('other', p.other_bytes);
        col('used', p.used_bytes);
      }
      col('used', g.used_bytes); col('capacity', g.capacity_bytes);
    }
    for (const key of Object.keys(units)) units[key] = unitOf(units[key]);
    const cell = (b, key) => bytesCell(b, units[key], { 'data-bytes': String(b), 'data-key': key });
    const measured = gpus.some((g) => g.processes.some((p) => p.source === 'measured'));
    const libraries = (p) => measured ? [cell(p.cublas_bytes || 0, 'cublas'), cell(p.cudnn_bytes || 0, 'cudnn'),
      cell(p.other_bytes || 0, 'other')] : [];
    const rows = [];
    for (const g of gpus) {
      for (const p of g.processes) {
        rows.push(el('tr', { 'data-gpu': g.physical, 'data-rank': p.rank },
          el('td', { text: String(g.physical) }), el('td', { text: String(p.rank) }),
          el('td', { text: p.cuda === null ? 'stray' : 'cuda:' + p.cuda }),
          ...(measured ? [el('td', { text: p.source === 'measured' ? 'measured' : 'modelled', 'data-key': 'source' })]
            : []),
          cell(p.context_bytes, 'context'), cell(p.reserved_bytes, 'reserved'), cell(p.nccl_bytes, 'nccl'),
          ...libraries(p), cell(p.used_bytes, 'used'), el('td', { text: '' })));
      }
      const blanks = measured ? 8 : 4;
      rows.push(el('tr', { class: 'total', 'data-gpu': g.physical },
        el('td', { text: String(g.physical) }), el('td', { text: 'total' }),
        ...Array.from({ length: blanks }, () => el('td')),
        cell(g.used_bytes, 'used'), cell(g.capacity_bytes, 'capacity')));
    }
    const columns = measured
      ? ['GPU', 'rank', 'as', 'source', 'context', 'reserved', 'NCCL', 'cuBLAS', 'cuDNN', 'other', 'used', 'capacity']
      : ['GPU', 'rank', 'as', 'context', 'reserved', 'NCCL', 'used', 'capacity'];
    const head = el('thead', {}, el('tr', {}, ...columns.map((h) => el('th', { text: h }))));
    const notes = gpus.filter((g) => g.shared_by_ranks.length > 1).map((g) => el('p', { class: 'note',
      text: 'GPU ' + g.physical + ' is shared by ranks ' + g.shared_by_ranks.join(', ') +
        ': they share its memory (allowed with Gloo; NCCL refuses two ranks on one GPU)' }));
    return el('div', { class: 'gpus' },
      el('h3', { text: measured ? 'GPUs (measured: CUPTI\'s allocations by calling library, each column its peak; ' +
        'context = NVML\'s used less the allocations)' : 'GPUs (as nvidia-smi lists processes; reserved is each ' +
        'rank\'s peak)' }),
      el('div', { class: 'table-wrap' }, el('table', { class: 'gpus' }, head, el('tbody', {}, ...rows))), ...notes);
  }

  // ---------------------------------------------------------------- one rank

  function RankView(run, ri, rk, yMax, axis) {
    const rep = rk.report;
    const st = RankState(rk);
    const pa = rep.peak.allocated, pr = rep.peak.reserved, fp = rep.fragmentation.peak;
    const facts = el('div', { class: 'facts' });
    facts.innerHTML = 'GPU ' + rep.device_index + ' of ' + fmtSize(rep.device_capacity) + ', alloc_conf ' +
      escapeHtml(rep.alloc_conf || '(defaults)') + ', ' + rep.events + ' events<br>' +
      'peak allocated <b data-key="peak_allocated">' + fmtSize(pa.bytes) + '</b>' +
      (pa.phase ? ' in ' + escapeHtml(pa.phase) : '') +
      ' · peak reserved <b data-key="peak_reserved">' + fmtSize(pr.bytes) + '</b>' +
      (pr.phase ? ' in ' + escapeHtml(pr.phase) : '') +
      ' · lower bound <b>' + fmtSize(rep.lower_bound_bytes) + '</b> (reserved ' + fmtSize(rep.overhead_bytes) +
      ' above it) · fragmentation at peak <b>' + fp.fragmentation.toFixed(3) + '</b>';
    const sec = el('section', { class: 'rank', id: 'run' + ri + '-rank' + rk.rank, 'data-rank': rk.rank },
      el('h3', { text: 'rank ' + rk.rank }), facts);
    if ((rep.pools_at_end || []).length) {
      sec.append(el('p', { class: 'pools', 'data-key': 'pools_at_end', text: 'by pool at end: ' +
        rep.pools_at_end.map(p => (p.pool_id[0] === 0 && p.pool_id[1] === 0 ? 'default pool' : 'private pool') +
          ' (' + p.pool_id.join(', ') + ') reserved ' + fmtSize(p.reserved) + ' in ' + p.segments +
          ' segment' + (p.segments === 1 ? '' : 's') + ', allocated ' + fmtSize(p.allocated)).join(' · ') }));
    }
    if (rep.oom) {
      sec.append(el('p', { class: 'oom-note', text: 'OOM' + (rep.oom.phase ? ' in ' + rep.oom.phase : '') +
        ': requested ' + fmtSize(rep.oom.requested_bytes) + '; ' + rep.oom.verdict }));
    }
    const tl = Timeline(rk, st, yMax, axis);
    axis.timelines.push(tl.draw);
    const table = PhaseTable(rk, st);
    const seg = SegmentMap(rk, st);
    sec.append(tl.root, el('div', { class: 'lower' }, table.root, seg.root));
    const sites = el('div', { class: 'lower sites-row' });
    if ((pa.top_sites || []).length) {
      sites.append(SitesTable('Top allocation sites at the peak', pa.top_sites, 'sites_peak'));
    }
    if (rep.oom && (rep.oom.top_sites || []).length) {
      sites.append(SitesTable('Top allocation sites at the OOM', rep.oom.top_sites, 'sites_oom'));
    }
    if (sites.children.length) sec.append(sites);
    return { root: sec, draw: () => { tl.draw(); seg.draw(); } };
  }

  // ---------------------------------------------------------------- two runs

  function DiffView(A, B) {
    const root = el('section', { class: 'diff', id: 'diff' }, el('h2', { text: 'Differences (B − A)' }));
    const byRank = new Map(B.ranks.map((r) => [r.rank, r]));
    for (const ra of A.ranks) {
      const rb = byRank.get(ra.rank);
      if (!rb) continue;
      const a = ra.report, b = rb.report;
      const rows = [
        ['peak allocated', a.peak.allocated.bytes, b.peak.allocated.bytes],
        ['peak reserved', a.peak.reserved.bytes, b.peak.reserved.bytes],
        ['lower bound (peak live requested)', a.lower_bound_bytes, b.lower_bound_bytes],
        ['reserved above the lower bound', a.overhead_bytes, b.overhead_bytes],
        ['inactive split at peak', a.fragmentation.peak.inactive_split_bytes, b.fragmentation.peak.inactive_split_bytes],
        ['allocated at end', a.fragmentation.end.allocated_bytes, b.fragmentation.end.allocated_bytes],
        ['reserved at end', a.fragmentation.end.reserved_bytes, b.fragmentation.end.reserved_bytes],
      ];
      for (const c of CATS) {
        const va = a.peak.allocated.by_category[c] || 0, vb = b.peak.allocated.by_category[c] || 0;
        if (va || vb) rows.push([c + ' at peak allocated', va, vb]);
      }
      const body = el('tbody');
      // A, B and B − A in one unit, so the table reads down and across.
      const unit = unitOf(rows.flatMap((r) => [r[1], r[2]]));
      for (const [name, va, vb] of rows) {
        const d = vb - va;
        body.append(el('tr', { class: d !== 0 ? 'jump' : null, 'data-metric': name },
          el('td', { class: 'name', text: name }), bytesCell(va, unit), bytesCell(vb, unit),
          el('td', { class: 'delta ' + (d > 0 ? 'up' : d < 0 ? 'down' : ''), text: signed(d, (v) => fmtIn(v, unit)),
            title: signed(d, fmtSize) }),
          el('td', { text: va ? (d >= 0 ? '+' : '') + (100 * d / va).toFixed(1) + '%' : '' })));
      }
      const fa = a.fragmentation.peak.fragmentation, fb = b.fragmentation.peak.fragmentation;
      body.append(el('tr', { class: fa !== fb ? 'jump' : null, 'data-metric': 'fragmentation at peak' },
        el('td', { class: 'name', text: 'fragmentation at peak' }), el('td', { text: fa.toFixed(3) }),
        el('td', { text: fb.toFixed(3) }), el('td', { text: (fb - fa >= 0 ? '+' : '') + (fb - fa).toFixed(3) }),
        el('td')));
      body.append(el('tr', { 'data-metric': 'OOM' }, el('td', { class: 'name', text: 'OOM' }),
        el('td', { text: a.oom ? 'yes' : 'no' }), el('td', { text: b.oom ? 'yes' : 'no' }), el('td'), el('td')));
      root.append(el('h3', { text: 'rank ' + ra.rank }), el('div', { class: 'table-wrap' }, el('table', {},
        el('thead', {}, el('tr', {}, ...['', 'A', 'B', 'B − A', ''].map((h, k) =>
          el('th', { class: k === 0 ? 'name' : null, text: h })))), body)));
      // The phase table of both, matched by phase name.
      const pb = new Map(b.phases.map((p) => [(p.step === null ? '' : p.step) + ':' + p.phase, p]));
      const prow = el('tbody');
      let shown = 0;
      for (const p of a.phases) {
        const q = pb.get((p.step === null ? '' : p.step) + ':' + p.phase);
        if (!q || shown++ >= 400) continue;
        const d = q.allocated_bytes - p.allocated_bytes, dr = q.max_reserved_bytes - p.max_reserved_bytes;
        prow.append(el('tr', { class: d !== 0 || dr !== 0 ? 'jump' : null },
          el('td', { class: 'name', text: p.step === null ? '-' : String(p.step) }),
          el('td', { class: 'name', text: p.phase }),
          el('td', { text: mib(p.allocated_bytes) }), el('td', { text: mib(q.allocated_bytes) }),
          el('td', { class: 'delta', text: signed(d, mibDelta) }),
          el('td', { text: mib(p.max_reserved_bytes) }), el('td', { text: mib(q.max_reserved_bytes) }),
          el('td', { class: 'delta', text: signed(dr, mibDelta) })));
      }
      if (shown) {
        root.append(el('div', { class: 'table-wrap', style: 'margin-top:8px' }, el('table', { class: 'phase-diff' },
          el('thead', {}, el('tr', {}, ...['iteration', 'phase', 'allocated A', 'allocated B', 'Δ', 'max reserved A',
            'max reserved B', 'Δ'].map((h, k) => el('th', { class: k < 2 ? 'name' : null, text: h })))), prow)));
      }
    }
    return root;
  }

  // ---------------------------------------------------------------- page

  function main() {
    const app = document.getElementById('app');
    app.replaceChildren();
    const runs = DATA.runs;
    const compare = runs.length > 1;
    document.getElementById('subtitle').textContent = DATA.generator + ' · ' +
      runs.map((r, i) => (compare ? 'ABCD'[i] + ': ' : '') + r.label + ' (' + r.ranks.length + ' rank' +
        (r.ranks.length === 1 ? '' : 's') + ')').join(' · ');
    // One height scale for every chart, so runs and ranks compare by eye.
    let yMax = 1;
    for (const r of runs) {
      for (const rk of r.ranks) {
        yMax = Math.max(yMax, rk.report.peak.reserved.bytes, rk.report.peak.allocated.bytes);
      }
    }
    yMax *= 1.08;
    if (compare) app.append(DiffView(runs[0], runs[1]));
    const grid = el('div', { class: 'runs' + (compare ? ' compare' : '') });
    const views = [];
    runs.forEach((run, ri) => {
      const col = el('section', { class: 'run', id: 'run' + ri },
        el('h2', { text: (compare ? 'ABCD'[ri] + ': ' : '') + run.label }));
      if (run.explain) col.append(ExplainView(run.explain));
      if (run.gpus && run.gpus.length) col.append(GpuTable(run.gpus));
      const axis = TimeAxis(run.ranks);
      for (const rk of run.ranks) {
        const v = RankView(run, ri, rk, yMax, axis);
        col.append(v.root);
        views.push(v);
      }
      if (!run.ranks.length) col.append(el('p', { class: 'note', text: 'no ranks' }));
      grid.append(col);
    });
    app.append(grid);
    const drawAll = () => views.forEach((v) => v.draw());
    drawAll();
    let pending = 0;
    window.addEventListener('resize', () => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(drawAll);
    });
    document.body.dataset.ready = 'true';
  }

  main();
})();
