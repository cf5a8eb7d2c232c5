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
  // The phase table's unit, as `memscope summary` prints it: whole MiB, "281M".
  function mib(b) { return Math.floor(b / MiB) + 'M'; }
  // A change in the table's unit; below 1 MiB in FormatSize's, so no "-0M".
  function mibDelta(b) { return b >= MiB ? mib(b) : fmtSize(b); }
  function signed(d, f) { return d > 0 ? '+' + f(d) : d < 0 ? '-' + f(-d) : '0'; }
  function kindName(k) { return k < CATS.length ? CATS[k] : KIND_NAMES[k - CATS.length]; }
  function kindColor(k) { return k < CATS.length ? CAT_COLORS[CATS[k]] : KIND_COLORS[k - CATS.length]; }
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

  function Timeline(rk, st, yMax) {
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
    const t0 = rk.t0, t1 = rk.t1 > rk.t0 ? rk.t1 : rk.t0 + 1;
    const view = { a: t0, b: t1 };
    const maxDepth = rk.bands.reduce((m, b) => Math.max(m, b.depth), 0);
    const bandRows = Math.min(maxDepth + 1, 3);
    const M = { left: 70, right: 14, top: 8 + bandRows * 14, bottom: 24 };
    let hoverX = null;

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
      const xEnd = Math.min(x(Math.max(view.b, t0), w), w - M.right);
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
      for (const b of rk.bands) {
        if (b.end < view.a || b.begin > view.b) continue;
        const xa = x(b.begin, w), xb = x(b.end, w);
        if (xb - xa < 0.5) continue;
        if (b.depth === 0) {
          ctx.globalAlpha = 0.08;
          ctx.fillStyle = phaseColor(b.name);
          ctx.fillRect(xa, plotTop, xb - xa, plotBottom - plotTop);
        }
        if (b.depth < bandRows) {
          const by = 4 + b.depth * 14;
          ctx.globalAlpha = b.moment >= 0 && rk.moments[st.moment] === rk.moments[b.moment] ? 1 : 0.75;
          ctx.fillStyle = phaseColor(b.name);
          ctx.fillRect(xa, by, Math.max(1, xb - xa - 1), 12);
          ctx.globalAlpha = 1;
          const label = b.name;
          if (xb - xa > ctx.measureText(label).width + 6) {
            ctx.fillStyle = '#fff';
            ctx.textAlign = 'left';
            ctx.textBaseline = 'middle';
            ctx.fillText(label, xa + 3, by + 6.5);
          }
        }
      }
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
      // Steps.
      let lastLabel = -1e9;
      ctx.setLineDash([3, 3]);
      for (const s of rk.steps) {
        if (s.t < view.a || s.t > view.b) continue;
        const px = x(s.t, w);
        ctx.strokeStyle = 'rgba(29,36,48,0.45)';
        ctx.beginPath(); ctx.moveTo(px, plotTop); ctx.lineTo(px, plotBottom); ctx.stroke();
        if (px - lastLabel > 48) {
          ctx.fillStyle = '#1d2430';
          ctx.textAlign = 'left';
          ctx.textBaseline = 'top';
          ctx.fillText('step ' + s.step, px + 3, plotTop + 2);
          lastLabel = px;
        }
      }
      ctx.setLineDash([]);
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
      canvas.dataset.viewStart = String(view.a);
      canvas.dataset.viewEnd = String(view.b);
      info.textContent = ' · ' + fmtTime(view.a - t0, span) + ' – ' + fmtTime(view.b - t0, span) + ' · ' +
        (rk.thinned ? n + ' of ' + rk.samples_total + ' samples drawn (thinned, peaks kept)'
          : n + ' samples');
    }

    let frame = 0;
    function scheduleDraw() {
      if (frame) return;
      frame = requestAnimationFrame(() => { frame = 0; draw(); });
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
      draw();
    }
    function reset() { view.a = t0; view.b = t1; draw(); }

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
      const row = (name, v, color) => '<tr><td>' + (color ? '<span class="swatch" style="background:' + color +
        '"></span> ' : '') + escapeHtml(name) + '</td><td>' + fmtSize(v) + '</td></tr>';
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
      const px = e.clientX - r.left;
      if (px < M.left || px > r.width - M.right) {
        hoverX = null;
        hideTip();
      } else {
        hoverX = px;
        showTip(hoverHtml(tAt(px, r.width)), e.clientX, e.clientY);
      }
      scheduleDraw();
    });
    canvas.addEventListener('mouseleave', () => { hoverX = null; hideTip(); draw(); });
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
      ...['step', 'phase', 'allocated', 'max allocated', 'reserved', 'max reserved', 'peak in phase', 'Δ allocated']
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

  function SegmentMap(rk, st) {
    const moments = rk.moments;
    const order = [];
    moments.forEach((m, i) => { if (m.key === 'peak' || m.key === 'oom') order.push(i); });
    moments.forEach((m, i) => { if (m.key !== 'peak' && m.key !== 'oom') order.push(i); });
    const select = el('select', { 'aria-label': 'moment', onchange: () => st.select(Number(select.value)) },
      ...order.map((i) => el('option', { value: i, text: momentLabel(moments[i]) })));
    let maxSize = 1;
    for (const m of moments) for (const s of m.segments) maxSize = Math.max(maxSize, s.size);
    const canvas = el('canvas', { class: 'segmap-canvas' });
    const scroll = el('div', { class: 'segscroll' }, canvas);
    const frag = el('dl', { class: 'frag' });
    const note = el('p', { class: 'note' });
    const title = el('h3');
    const legendKinds = [];
    const present = new Set();
    for (const m of moments) for (const s of m.segments) for (const b of s.blocks) present.add(b[2]);
    for (let k = 0; k < CATS.length + KIND_NAMES.length; ++k) if (present.has(k)) legendKinds.push(k);
    const legend = el('div', { class: 'legend' }, ...legendKinds.map((k) =>
      el('span', {}, el('span', { class: 'swatch', style: 'background:' + kindColor(k) }), kindName(k))));
    const root = el('div', { class: 'segpanel' }, title, select,
      el('div', { class: 'segbody' }, scroll, frag), legend, note);
    const ROW = 16, LABEL = 150;

    function draw() {
      const m = moments[st.moment];
      if (!m) return;
      select.value = String(st.moment);
      root.dataset.moment = m.key;
      root.dataset.segments = String(m.segments.length);
      title.textContent = 'Segment map at ' + momentLabel(m) + ' (' + m.segments.length + ' segment' +
        (m.segments.length === 1 ? '' : 's') + ')';
      const { ctx, w, h } = fitCanvas(canvas, Math.max(ROW * m.segments.length + 4, 24));
      ctx.clearRect(0, 0, w, h);
      ctx.font = '11px system-ui, sans-serif';
      ctx.textBaseline = 'middle';
      const barMax = w - LABEL - 6;
      m.segments.forEach((s, r) => {
        const yy = 2 + r * ROW;
        ctx.fillStyle = '#5b6575';
        ctx.textAlign = 'right';
        ctx.fillText(fmtSize(s.size) + ' ' + s.pool + (s.stream ? ' s' + s.stream : '') +
          (s.expandable ? ' exp' : ''), LABEL - 6, yy + ROW / 2);
        const width = Math.max(2, s.size / maxSize * barMax);
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
      });
      const f = m.fragmentation;
      frag.replaceChildren();
      const item = (k, v, key) => frag.append(el('dt', { text: k }), el('dd', { 'data-key': key, text: v }));
      item('reserved', fmtSize(f.reserved_bytes), 'reserved_bytes');
      item('allocated', fmtSize(f.allocated_bytes), 'allocated_bytes');
      item('reserved − allocated', fmtSize(f.reserved_minus_allocated_bytes), 'reserved_minus_allocated_bytes');
      item('free in segments', fmtSize(f.free_in_segments_bytes), 'free_in_segments_bytes');
      item('largest free block', fmtSize(f.largest_free_block_bytes), 'largest_free_block_bytes');
      item('fragmentation', f.fragmentation.toFixed(3), 'fragmentation');
      item('inactive split', fmtSize(f.inactive_split_bytes), 'inactive_split_bytes');
      item('segments', String(f.segments), 'segments');
      item('free blocks', String(f.free_blocks), 'free_blocks');
      const notes = [];
      if (st.note) notes.push(st.note);
      if (m.segments_total > m.segments.length) {
        notes.push('the ' + m.segments.length + ' largest of ' + m.segments_total + ' segments are drawn');
      }
      if (m.segments.some((s) => s.merged)) notes.push('segments with many blocks are drawn in slices');
      notes.push('fragmentation = 1 − largest free block / free in segments');
      note.textContent = notes.join('; ');
    }
    canvas.addEventListener('mousemove', (e) => {
      const m = moments[st.moment];
      const r = canvas.getBoundingClientRect();
      const row = Math.floor((e.clientY - r.top - 2) / ROW);
      const s = m && m.segments[row];
      if (!s) return hideTip();
      const width = Math.max(2, s.size / maxSize * (r.width - LABEL - 6));
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
    canvas.addEventListener('mouseleave', hideTip);
    st.listeners.push(draw);
    return { root, draw };
  }

  // ---------------------------------------------------------------- allocation sites

  // The top allocation sites (bytes by stack, like memray's table): at the
  // peak and at an OOM. A site is an imported allocation's stack (the user's
  // frames, innermost first) or, for memscope's own runs, category and owner.
  function SitesTable(title, sites, key) {
    const body = el('tbody', {}, ...sites.map((s) => el('tr', {},
      el('td', { text: fmtSize(s.bytes) }), el('td', { text: String(s.allocations) }),
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
      el('div', { class: 'table-wrap' }, el('table', { class: 'explain' }, head, el('tbody', {}, ...rows))));
  }

  // ---------------------------------------------------------------- the whole GPU

  // The run's GPU table (report.json "gpus"), as nvidia-smi lists processes:
  // per physical GPU, each process's context + peak reserved + NCCL = used,
  // then the GPU's total against its capacity. Each byte cell carries its
  // exact value in data-bytes.
  // A capture with --all-device-memory (capture.md) has measured rows
  // ("source": "measured"): then a source column and cuBLAS, cuDNN and other.
  function GpuTable(gpus) {
    const cell = (b, key) => el('td', { text: fmtSize(b), 'data-bytes': String(b), 'data-key': key });
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

  function RankView(run, ri, rk, yMax) {
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
    const tl = Timeline(rk, st, yMax);
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
      for (const [name, va, vb] of rows) {
        const d = vb - va;
        body.append(el('tr', { class: d !== 0 ? 'jump' : null, 'data-metric': name },
          el('td', { class: 'name', text: name }), el('td', { text: fmtSize(va) }), el('td', { text: fmtSize(vb) }),
          el('td', { class: 'delta ' + (d > 0 ? 'up' : d < 0 ? 'down' : ''), text: signed(d, fmtSize) }),
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
          el('thead', {}, el('tr', {}, ...['step', 'phase', 'allocated A', 'allocated B', 'Δ', 'max reserved A',
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
      for (const rk of run.ranks) {
        const v = RankView(run, ri, rk, yMax);
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
