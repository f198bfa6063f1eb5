// grpokit view: the run explorer's script. Every number comes computed from grpokit.view.data; this file
// only lays out, formats and colours. No network, no build step: uPlot is inlined before it.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const RUNS = DATA.runs;
  const $ = (id) => document.getElementById(id);
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const DASHES = [undefined, [8, 5], [2, 4], [10, 3, 2, 3]];
  // the legend's marker for each run: a short line in the series' colour, drawn in the run's CSS border style
  const MARKER_STYLES = ["solid", "dashed", "dotted", "double"];
  function dashSample(r, colour) {
    // a 28 px line in run r's dash pattern, for the run key above the curves
    const dash = DASHES[r % DASHES.length];
    return `<svg width="28" height="8" aria-hidden="true"><line x1="0" y1="4" x2="28" y2="4" stroke="${colour}" stroke-width="2"${dash ? ` stroke-dasharray="${dash.join(" ")}"` : ""}/></svg>`;
  }

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (typeof v !== "number") return String(v);
    const d = digits === undefined ? 4 : digits;
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(d - 1);
    return v.toFixed(d);
  }
  function tick(v) {
    // an axis label: 1e-5 as "1.0e-5" (uPlot's default shows a learning rate of 1e-5 as "0")
    if (v === null || v === undefined) return "";
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(2).replace(/\.?0+e/, "e");
    return String(+v.toPrecision(4));
  }
  function num(v, digits) {
    // a number cell: the shown text, and the exact value in data-value for readers (and tests)
    const cls = typeof v === "number" ? (v > 0 ? "pos" : v < 0 ? "neg" : "") : "muted";
    return `<span class="${cls}" data-value="${v === null || v === undefined ? "" : v}">${fmt(v, digits)}</span>`;
  }
  function list(values, digits) {
    return "[" + values.map((v) => fmt(v, digits)).join(", ") + "]";
  }

  // ------------------------------------------------------------------------------------------- warnings
  // what grpokit.view.data left out (a damaged rollouts file, a metrics line that does not parse)
  const WARNINGS = RUNS.flatMap((r) => (r.warnings || []).map((w) => `${r.name}: ${w}`));
  if (WARNINGS.length) {
    $("warnings").innerHTML = `<ul>${WARNINGS.map((w) => `<li>${esc(w)}</li>`).join("")}</ul>`;
  }

  // ------------------------------------------------------------------------------------------- tabs
  function showTab(name) {
    document.querySelectorAll(".panel").forEach((p) => p.classList.toggle("active", p.id === name));
    document.querySelectorAll(".tab").forEach((a) => a.classList.toggle("active", a.dataset.tab === name));
    if (name === "curves") drawCharts();
  }
  document.querySelectorAll(".tab").forEach((a) =>
    a.addEventListener("click", (e) => {
      e.preventDefault();
      history.replaceState(null, "", "#" + a.dataset.tab);
      showTab(a.dataset.tab);
    })
  );

  // ------------------------------------------------------------------------------------------- curves
  function rewardKeys(run) {
    const keys = Object.keys(run.metrics.cols).filter((k) => k.startsWith("reward/") && k.endsWith("/mean") && k !== "reward/total/mean");
    return ["reward/total/mean", ...keys.sort()];
  }
  const PANELS = [
    { title: "reward: total and per function (mean)", keys: rewardKeys },
    { title: "accuracy: train, and held-out (eval.jsonl)", keys: () => ["accuracy"], evalKeys: ["accuracy"] },
    { title: "KL to the reference", keys: () => ["kl"] },
    { title: "entropy", keys: () => ["entropy"] },
    // the rollout engine against the trainer (issue 41): KL(sampler || trainer) and the mean log-prob gap
    { title: "sampler vs trainer: KL (k3) and mean |log-prob gap|", keys: () => ["sampler_kl", "sampler_logprob_diff/mean"] },
    { title: "completion length: correct vs incorrect", keys: () => ["completion_len/mean", "completion_len/correct", "completion_len/incorrect"] },
    { title: "clip fractions", keys: () => ["clip_frac", "clip_frac_low", "clip_frac_high"] },
    { title: "time per phase (s)", keys: () => ["time/generation", "time/scoring", "time/reference", "time/update", "time/step"] },
    // loss and grad norm on axes of their own: their scales differ by orders of magnitude
    { title: "loss", keys: () => ["loss"] },
    { title: "grad norm (before clipping)", keys: () => ["grad_norm"] },
    { title: "learning rate", keys: () => ["lr"] },
  ];
  // any logged metric, chosen in the curves' controls, gets a panel of its own
  const ALL_KEYS = Array.from(new Set(RUNS.flatMap((r) => Object.keys(r.metrics.cols)))).sort();
  const chosen = { key: "", smoothing: 0 };
  const charts = []; // the uPlot instances (tests read them through window.grpokitView)
  window.grpokitView = { charts: charts };
  function smooth(values, weight) {
    // TensorBoard's smoothing: an exponential moving average over the logged points, debiased at the start;
    // gaps (null) stay gaps
    if (!weight) return values;
    let last = 0;
    let n = 0;
    return values.map((v) => {
      if (v === null || v === undefined || Number.isNaN(v)) return v;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));
    });
  }
  let chartsDrawn = false;
  function drawCharts() {
    if (chartsDrawn) return;
    chartsDrawn = true;
    const box = $("charts");
    box.innerHTML = "";
    const key = $("run-key");
    if (RUNS.length > 1 && key) key.innerHTML = "runs: " + RUNS.map((run, r) => `<span class="run" data-run="${esc(run.name)}">${dashSample(r, "#333")} ${esc(run.name)}</span>`).join("");
    charts.splice(0).forEach((u) => u.destroy());
    const old = $("not-logged");
    if (old) old.remove();
    const missing = [];
    const panels = chosen.key ? [{ title: "chosen: " + chosen.key, keys: () => [chosen.key], chosen: true }, ...PANELS] : PANELS;
    panels.forEach((panel, p) => {
      const lines = [];
      RUNS.forEach((run, r) => {
        const keys = panel.keys(run);
        keys.forEach((k) => {
          if (run.metrics.cols[k] && run.metrics.cols[k].some((v) => v !== null)) lines.push({ run: r, src: run.metrics, key: k, label: k });
        });
        (panel.evalKeys || []).forEach((k) => {
          if (run.eval.cols[k] && run.eval.cols[k].some((v) => v !== null)) lines.push({ run: r, src: run.eval, key: k, label: "held-out " + k, points: true });
        });
      });
      if (!lines.length) {
        if (!panel.chosen) missing.push(panel.title); // an SFT run has no KL, entropy...: no empty panel for each
        return;
      }
      // several runs: metric-major, so that the legend lists each metric's runs one under the other
      const firstOf = {};
      lines.forEach((l, i) => (firstOf[l.label] = l.label in firstOf ? firstOf[l.label] : i));
      lines.sort((x, y) => firstOf[x.label] - firstOf[y.label] || x.run - y.run);
      const div = document.createElement("div");
      div.className = RUNS.length > 1 ? "chart runs" : "chart";
      div.id = panel.chosen ? "chart-chosen" : "chart-" + PANELS.indexOf(panel);
      div.innerHTML = `<h3>${esc(panel.title)}</h3>`;
      box.appendChild(div);
      const xs = Array.from(new Set(lines.flatMap((l) => l.src.step))).sort((a, b) => a - b);
      const data = [xs];
      const series = [{ label: "step" }];
      const keyIndex = {};
      lines.forEach((l) => {
        const at = new Map(l.src.step.map((s, i) => [s, l.src.cols[l.key][i]]));
        data.push(smooth(xs.map((x) => (at.has(x) ? at.get(x) : null)), l.points ? 0 : chosen.smoothing));
        if (!(l.label in keyIndex)) keyIndex[l.label] = Object.keys(keyIndex).length;
        const colour = PALETTE[(keyIndex[l.label] + (RUNS.length > 1 ? 0 : 0)) % PALETTE.length];
        series.push({
          label: RUNS.length > 1 ? `${RUNS[l.run].name}: ${l.label}` : l.label,
          stroke: colour,
          width: 1.5,
          dash: DASHES[l.run % DASHES.length],
          spanGaps: true,
          points: { show: !!l.points, size: 6 },
          value: (u, v) => fmt(v),
        });
      });
      const width = Math.max(300, div.clientWidth - 14);
      const axes = [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, { size: 60, values: (u, vals) => vals.map(tick) }];
      // a flat series (all 0) gets a small range around its value instead of uPlot's 0..100
      const yRange = (u, min, max) => (min === max ? [min - (Math.abs(min) || 1) * 0.1, max + (Math.abs(max) || 1) * 0.1] : uPlot.rangeNum(min, max, 0.1, true));
      // one cursor for every panel: hovering a step in one shows that step in all (cursor.sync)
      const cursor = { sync: { key: "grpokit-steps", setSeries: false } };
      // the legend's marker is the series' line (its colour, its run's dash), not uPlot's filled box
      const legend = { live: true, markers: { width: 2, dash: (u, i) => MARKER_STYLES[(lines[i - 1] ? lines[i - 1].run : 0) % MARKER_STYLES.length], fill: () => "transparent" } };
      const u = new uPlot({ width: width, height: 220, series: series, scales: { x: { time: false }, y: { range: yRange } }, axes: axes, legend: legend, cursor: cursor }, data, div);
      u.root.querySelectorAll(".u-legend tr.u-series").forEach((tr, i) => {
        if (i > 0) tr.dataset.run = RUNS[lines[i - 1].run].name; // which run each legend entry is (tests read it)
      });
      charts.push(u);
    });
    if (missing.length) {
      box.insertAdjacentHTML("afterend", `<p id="not-logged" class="muted">not logged by ${RUNS.length > 1 ? "these runs" : "this run"}: ${missing.map(esc).join("; ")}</p>`);
    }
  }

  $("metric-select").innerHTML = `<option value="">(none)</option>` + ALL_KEYS.map((k) => `<option value="${esc(k)}">${esc(k)}</option>`).join("");
  $("metric-select").addEventListener("change", (e) => {
    chosen.key = e.target.value;
    chartsDrawn = false;
    drawCharts();
  });
  $("smoothing").addEventListener("input", (e) => {
    chosen.smoothing = +e.target.value;
    $("smoothing-value").textContent = chosen.smoothing.toFixed(2);
    chartsDrawn = false;
    drawCharts();
  });

  // ------------------------------------------------------------------------------------------- step browser
  const state = { run: 0, step: 0, group: null, row: null, quantity: "adv_x_ratio" };
  const QUANTITIES = [
    ["adv_x_ratio", "advantage × ratio", "diverging", 0],
    ["advantages", "advantage", "diverging", 0],
    ["logprobs", "log-prob (policy, in the update)", "low", 0],
    ["old_logprobs", "old log-prob (ratio's denominator)", "low", 0],
    ["ratio", "ratio π/π_old", "diverging", 1],
    ["clip", "clipped (−1 below, +1 above)", "diverging", 0],
    ["entropy", "entropy", "high", 0],
    ["kl", "KL to the reference (per token)", "high", 0],
    ["loss", "per-token loss term", "diverging", 0],
    ["step_rewards", "step reward (process supervision)", "diverging", 0],
    ["loss_mask", "trained (1; 0 = masked: tool tokens, DAPO truncation)", "high", 0],
  ];
  const decoded = new Map();
  function b64(s, Type) {
    const bin = atob(s);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Type(bytes.buffer);
  }
  function tokensOf(r, s) {
    const key = r + ":" + s;
    if (!decoded.has(key)) {
      const t = RUNS[r].steps[s].tokens;
      const out = { offsets: t.offsets, ids: b64(t.ids, Int32Array), fields: {} };
      for (const [name, value] of Object.entries(t.fields)) out.fields[name] = b64(value, Float32Array);
      decoded.set(key, out);
    }
    return decoded.get(key);
  }
  function currentStep() {
    return RUNS[state.run].steps[state.step];
  }

  function fillRuns() {
    $("run-select").innerHTML = RUNS.map((r, i) => `<option value="${i}">${esc(r.name)}</option>`).join("");
    $("run-select").addEventListener("change", (e) => {
      state.run = +e.target.value;
      state.step = 0;
      fillSteps();
    });
    ["group-filter", "group-sort"].forEach((id) => $(id).addEventListener("change", renderGroups));
    $("step-select").addEventListener("change", (e) => {
      state.step = +e.target.value;
      state.group = null;
      renderStep();
    });
    $("quantity").addEventListener("change", (e) => {
      state.quantity = e.target.value;
      renderTokens();
    });
    fillSteps();
  }
  function fillSteps() {
    const steps = RUNS[state.run].steps;
    $("step-select").innerHTML = steps.map((s, i) => `<option value="${i}">step ${s.step}</option>`).join("");
    state.group = null;
    renderStep();
  }

  function loggedAt(step, key) {
    const m = RUNS[state.run].metrics;
    const i = m.step.indexOf(step);
    return i < 0 || !m.cols[key] ? null : m.cols[key][i];
  }
  function renderStep() {
    $("token-info").textContent = ""; // a token picked in another step is not this step's
    const st = currentStep();
    if (!st) {
      $("step-summary").innerHTML = `<p class="muted">This run saved no steps (train.samples_every = 0, or it stopped before the first sampled step).</p>`;
      $("groups").innerHTML = "";
      $("group-detail").innerHTML = "";
      $("token-view").innerHTML = "";
      $("objective").innerHTML = "";
      return;
    }
    const rows = [
      ["reward/total/mean", "mean total reward", st.totals.reward_mean],
      ["loss", "loss", st.totals.loss],
      ["clip_frac", "clip fraction", st.totals.clip_frac],
      ["kl", "KL", st.totals.kl],
    ];
    if (st.totals.entropy_bonus !== null && st.totals.entropy_bonus !== undefined)
      rows.splice(2, 0, ["entropy/bonus", "entropy the bonus acts on", st.totals.entropy_bonus]);
    $("step-summary").innerHTML =
      `<table id="step-totals"><tr><th>step ${st.step}</th><th>logged (metrics.jsonl)</th><th>recomputed from the saved tokens</th></tr>` +
      rows.map(([k, label, v]) => `<tr data-key="${k}"><th>${label}</th><td class="logged">${num(loggedAt(st.step, k))}</td><td class="saved">${num(v)}</td></tr>`).join("") +
      `</table><div class="muted">${st.groups.length} groups of ${st.group_size}; advantage: ${esc(st.algo.advantage)}, loss aggregation: ${esc(st.algo.agg)}. The loss agrees with the log when mini-batches hold whole groups of equal size${st.totals.entropy_bonus !== null && st.totals.entropy_bonus !== undefined ? " and, with the entropy bonus (a token mean per mini-batch), one mini-batch a step or mini-batches of alike token counts" : ""}.${st.bonus_unknown ? " The run had an entropy bonus whose α this file does not hold (written before grpokit recorded it): the loss shown leaves it out." : ""}</div>`;
    const present = QUANTITIES.filter(([q]) => tokensOf(state.run, state.step).fields[q].some((v) => !Number.isNaN(v)));
    $("quantity").innerHTML = present.map(([q, label]) => `<option value="${q}"${q === state.quantity ? " selected" : ""}>${esc(label)}</option>`).join("");
    if (!present.some(([q]) => q === state.quantity)) state.quantity = present.length ? present[0][0] : null;
    renderGroups();
  }

  function renderGroups() {
    const st = currentStep();
    if (!st) return;
    const filter = $("group-filter").value;
    const sort = $("group-sort").value;
    let groups = st.groups.filter((g) =>
      filter === "all" ? true : filter === "spread" ? !g.flat : filter === "flat" ? g.flat : filter === "truncated" ? g.truncated > 0 : g.failed > 0
    );
    const clipped = (g) => g.clipped.reduce((a, b) => a + b, 0);
    const keyOf = { group: (g) => g.group, mean: (g) => -g.mean, std: (g) => -g.std, loss: (g) => -(g.loss ?? 0), clipped: (g) => -clipped(g) }[sort];
    groups = groups.slice().sort((a, b) => keyOf(a) - keyOf(b) || a.group - b.group);
    $("groups").innerHTML =
      `<tr><th>group</th><th>prompt</th><th>mean</th><th>std</th><th>trunc.</th><th>no value</th><th>clipped</th><th>loss</th></tr>` +
      groups
        .map(
          (g) =>
            `<tr class="group-row${g.group === state.group ? " selected" : ""}" data-group="${g.group}"><td>${g.group}${g.flat ? ' <span class="muted">flat</span>' : ""}</td>` +
            `<td class="prompt">${esc(g.prompt.slice(0, 80))}</td><td>${num(g.mean, 3)}</td><td>${num(g.std, 3)}</td><td>${g.truncated}</td><td>${g.failed}</td><td>${clipped(g)}</td><td>${num(g.loss, 4)}</td></tr>`
        )
        .join("");
    if (!groups.length) $("groups").insertAdjacentHTML("beforeend", `<tr><td colspan="8" class="muted">no group matches</td></tr>`);
    $("groups").querySelectorAll("tr.group-row").forEach((tr) => tr.addEventListener("click", () => selectGroup(+tr.dataset.group)));
    // the detail pane follows the filter: a group it filtered out gives way to the first shown, or to none
    if (groups.length && !groups.some((g) => g.group === state.group)) selectGroup(groups[0].group);
    else if (!groups.length) clearGroup();
  }

  function clearGroup() {
    state.group = null;
    state.row = null;
    $("group-detail").innerHTML = `<p class="muted" id="no-group">No group matches the filter.</p>`;
    $("token-view").innerHTML = "";
    $("token-legend").innerHTML = "";
    $("token-info").textContent = "";
    $("objective").innerHTML = "";
  }

  function selectGroup(g) {
    state.group = g;
    state.row = null;
    $("groups").querySelectorAll("tr.group-row").forEach((tr) => tr.classList.toggle("selected", +tr.dataset.group === g));
    const st = currentStep();
    const grp = st.groups[g];
    const R = st.rows;
    const G = st.group_size;
    const names = st.reward_names;
    let html = `<div class="prompt-full" id="g-prompt">${esc(grp.prompt)}</div>`;
    if (grp.ground_truth !== null && grp.ground_truth !== undefined) {
      const column = st.ground_truth_column ? ` <span class="truth-column">(column ${esc(st.ground_truth_column)})</span>` : "";
      html += `<div class="truth" id="g-truth"><span class="truth-label">ground truth${column}:</span> <span id="g-truth-value">${esc(grp.ground_truth)}</span></div>`;
    }
    html += `<div id="g-stats">group ${g}: mean reward <span id="g-mean">${num(grp.mean)}</span>, std (ddof ${grp.std_ddof}) <span id="g-std">${num(grp.std)}</span>${grp.flat ? " — flat: every advantage is 0" : ""}</div>`;
    html += `<table id="completions"><tr><th>#</th><th>completion</th>${names.map((n) => `<th>${esc(n)}</th>`).join("")}<th>total</th><th>advantage</th><th>tokens</th><th>trunc.</th></tr>`;
    for (let j = 0; j < G; j++) {
      const i = g * G + j;
      html +=
        `<tr class="completion-row" data-row="${i}" data-index="${j}"><td>${j}</td><td class="completion">${esc(R.completion[i])}</td>` +
        names.map((n) => `<td data-field="reward/${esc(n)}">${num(R.rewards[n][i], 3)}</td>`).join("") +
        `<td data-field="reward">${num(R.reward[i], 3)}</td><td data-field="advantage">${num(R.advantage[i])}</td><td>${R.length[i]}</td><td>${R.truncated[i] ? "yes" : ""}</td></tr>`;
    }
    html += `</table>`;
    $("group-detail").innerHTML = html;
    $("completions").querySelectorAll("tr.completion-row").forEach((tr) => tr.addEventListener("click", () => selectRow(+tr.dataset.row)));
    renderObjective();
    selectRow(g * G);
  }

  function selectRow(i) {
    state.row = i;
    $("completions").querySelectorAll("tr.completion-row").forEach((tr) => tr.classList.toggle("selected", +tr.dataset.row === i));
    renderTokens();
  }

  function colourOf(kind, centre, v, scale) {
    if (Number.isNaN(v)) return "transparent";
    let t;
    if (kind === "diverging") t = scale > 0 ? (v - centre) / scale : 0;
    else if (kind === "low") t = scale > 0 ? -Math.abs(v - centre) / scale : 0; // the further below, the stronger
    else t = scale > 0 ? Math.abs(v) / scale : 0;
    t = Math.max(-1, Math.min(1, t));
    if (kind === "low") return `rgba(31, 119, 180, ${(0.85 * -t).toFixed(3)})`;
    if (kind === "high") return `rgba(148, 103, 189, ${(0.85 * t).toFixed(3)})`;
    return t >= 0 ? `rgba(10, 125, 50, ${(0.8 * t).toFixed(3)})` : `rgba(179, 38, 30, ${(0.8 * -t).toFixed(3)})`;
  }

  function renderTokens() {
    $("token-info").textContent = ""; // the picked token's line belongs to the token view it was picked in
    const st = currentStep();
    if (!st || state.row === null || !state.quantity) return;
    const tok = tokensOf(state.run, state.step);
    const vocab = RUNS[state.run].vocab;
    const i = state.row;
    const a = tok.offsets[i];
    const b = tok.offsets[i + 1];
    const [, label, kind, centre] = QUANTITIES.find(([q]) => q === state.quantity);
    const values = Array.from(tok.fields[state.quantity].slice(a, b));
    const finite = values.filter((v) => !Number.isNaN(v));
    const scale = finite.length ? Math.max(...finite.map((v) => Math.abs(v - (kind === "high" ? 0 : centre)))) : 0;
    const spans = [];
    for (let k = a; k < b; k++) {
      const text = vocab[String(tok.ids[k])] ?? `<${tok.ids[k]}>`;
      const v = tok.fields[state.quantity][k];
      const masked = tok.fields.loss_mask[k] === 0;
      const tip = QUANTITIES.map(([q, l]) => `${l}: ${fmt(tok.fields[q][k])}`).join("\n");
      spans.push(
        `<span class="tok${masked ? " masked" : ""}" data-pos="${k - a}" data-value="${v}" style="background:${colourOf(kind, centre, v, scale)}" title="${esc(`token ${k - a} ${JSON.stringify(text)}\n` + tip)}">${esc(text)}</span>`
      );
    }
    $("token-view").innerHTML = spans.join("");
    $("token-legend").innerHTML = `${esc(label)}: ${kind === "diverging" ? `${fmt(centre - scale)} <span class="swatch" style="background:linear-gradient(90deg, rgba(179,38,30,.8), #fff, rgba(10,125,50,.8))"></span> ${fmt(centre + scale)}` : kind === "low" ? `${fmt(centre - scale)} <span class="swatch" style="background:linear-gradient(90deg, rgba(31,119,180,.85), #fff)"></span> ${fmt(centre)}` : `0 <span class="swatch" style="background:linear-gradient(90deg, #fff, rgba(148,103,189,.85))"></span> ${fmt(scale)}`} · completion ${i % st.group_size} of group ${state.group} · struck through: not trained`;
    $("token-view").querySelectorAll(".tok").forEach((span) =>
      span.addEventListener("click", () => {
        $("token-view").querySelectorAll(".tok.picked").forEach((s) => s.classList.remove("picked"));
        span.classList.add("picked");
        $("token-info").textContent = span.title.replace(/\n/g, " · ");
      })
    );
  }

  function renderObjective() {
    const st = currentStep();
    const g = st.groups[state.group];
    const G = st.group_size;
    const R = st.rows;
    const al = st.algo;
    const rewards = R.reward.slice(state.group * G, (state.group + 1) * G);
    const saved = R.advantage.slice(state.group * G, (state.group + 1) * G);
    const sum = rewards.reduce((x, y) => x + y, 0);
    const lo = 1 - al.eps_low;
    const hi = 1 + al.eps_high;
    const kl = al.kl_kind;
    const line = (label, text) => `<div class="line"><span class="label">${label}</span>${text}</div>`;
    const agg = {
      "seq-mean-token-mean": "(1/G) Σ_i (1/|o_i|) Σ_t l'_{i,t}",
      "token-mean": "Σ_{i,t} l'_{i,t} / Σ_i |o_i|",
      "seq-sum-norm": `Σ_{i,t} l'_{i,t} / (G · ${al.norm_len})`,
    }[al.agg];
    let html = `<h3>The objective for group ${state.group} of step ${st.step}, with its real numbers</h3>`;
    html += line("rewards", `r = ${list(rewards, 3)}   (weighted total of ${st.reward_names.map(esc).join(", ")})`);
    html += line("mean", `mean = (1/G) Σ r_i = ${fmt(sum, 4)} / ${G} = <span id="obj-mean">${fmt(g.mean)}</span>`);
    html += line("std", `std = sqrt(Σ (r_i − mean)² / (G − ${g.std_ddof})) = <span id="obj-std">${fmt(g.std)}</span>${al.std_eps !== undefined ? `, eps = ${al.std_eps}` : ""}`);
    html += line(
      "advantages",
      g.advantages_recomputed
        ? `${esc(g.advantage_formula)} = <span id="obj-adv">${list(g.advantages_recomputed)}</span>   (the update used ${list(saved)})`
        : `${esc(g.advantage_formula)}: <span id="obj-adv">${list(saved)}</span>`
    );
    html += line("ratios", `ρ_{i,t} = exp(log π_θ − log π_old) (${esc(al.ratio_level)} level): mean per completion ${list(g.ratio_mean)}, min ${fmt(Math.min(...g.ratio_min))}, max ${fmt(Math.max(...g.ratio_max))}`);
    html += line(
      "clipped surrogate",
      `l_{i,t} = −min(ρ A, clip(ρ, ${fmt(lo, 2)}, ${fmt(hi, 2)}) A)${al.dual_clip ? `, dual clip c = ${al.dual_clip}` : ""}: token mean per completion ${list(g.pg_mean)}; clipped tokens ${g.clipped.reduce((a, b) => a + b, 0)} of ${g.tokens.reduce((a, b) => a + b, 0)}`
    );
    html += line("KL term", g.kl_mean ? `β · ${kl}(π_θ ‖ π_ref), β = ${al.beta}: ${kl} token mean per completion ${list(g.kl_mean)}` : `no reference model (β = ${al.beta})`);
    html += line("per-token loss", `l'_{i,t} = l_{i,t} + β · kl_{i,t}: token mean per completion ${list(g.loss_mean)}`);
    const bonus = g.bonus !== null && g.bonus !== undefined;
    if (bonus)
      html += line(
        "entropy bonus",
        `α · H̄ = α · Σ m'_{i,t} H_{i,t} / Σ m'_{i,t} (a token mean over the trained tokens${al.top_entropy_quantile < 1 ? " the entropy mask keeps" : ""}, whatever the aggregation), α = ${g.bonus_coef.map((a) => fmt(a)).join(" / ")}${al.adaptive_entropy ? " (adaptive: its optimizer step's)" : ""}, H̄ = <span id="obj-bonus-entropy">${fmt(g.bonus_entropy)}</span>: <span id="obj-bonus">${fmt(g.bonus, 6)}</span>`
      );
    else if (st.bonus_unknown) html += line("entropy bonus", `in the run's loss, but its α is not in this file (written before grpokit recorded it): left out below`);
    html += line("loss", `${al.agg}: ${agg}${bonus ? " − α · H̄" : ""} = <span id="obj-loss">${fmt(g.loss, 6)}</span>   (this group alone; the step's loss averages it over the mini-batch's groups)`);
    if (al.loss !== "clipped") html += `<div class="muted">The run's loss is "${esc(al.loss)}": the terms above are the clipped surrogate's, for reference.</div>`;
    $("objective").innerHTML = html;
  }

  // ------------------------------------------------------------------------------------------- prompt history
  // each training prompt's visits as the newest checkpoint holds them (data.selection; grpokit.view.data)
  const KINDS = { 1: "all solved", "-1": "all failed", 0: "spread" };
  function fillHistory() {
    const pick = $("history-run");
    pick.innerHTML = RUNS.map((r, i) => `<option value="${i}">${esc(r.name)}</option>`).join("");
    pick.onchange = drawHistory;
    $("history-sort").onchange = drawHistory;
    drawHistory();
  }
  function drawHistory() {
    const h = RUNS[+$("history-run").value].history;
    if (!h) {
      $("history-summary").innerHTML = `<p class="muted">No prompt history in this run's newest checkpoint: prompt selection was off (data.selection.mode=off) or no checkpoint was saved.</p>`;
      $("history-table").innerHTML = "";
      return;
    }
    const c = h.counts;
    $("history-summary").innerHTML =
      `<p>At step ${h.step}: ${c.seen} of ${h.n} training prompts visited; last visit all solved ${c.solved}, all failed ${c.failed}. ` +
      `A prompt flat on its last z visits is generated with probability p^z: p = ${fmt(h.p_solved, 2)} (solved), ${fmt(h.p_failed, 2)} (failed).</p>`;
    const key = $("history-sort").value;
    const rows = h.rows.slice().sort((a, b) => (key === "row" ? a.row - b.row : (b[key] ?? -1) - (a[key] ?? -1)));
    const head = "<tr><th>row</th><th>visits</th><th>last step</th><th>recent pass rate</th><th>last reward mean</th><th>last reward spread</th><th>last visit</th><th>flat in a row</th><th>skipped</th></tr>";
    $("history-table").innerHTML = head + rows.map((r) =>
      `<tr data-row="${r.row}"><td>${r.row}</td><td>${r.visits}</td><td>${r.last_step < 0 ? "–" : r.last_step + 1}</td><td>${num(r.pass_rate, 3)}</td>` +
      `<td>${num(r.reward_mean, 3)}</td><td>${num(r.reward_spread, 3)}</td><td>${r.visits ? KINDS[r.kind] : "–"}</td><td>${r.flat_run}</td><td>${r.skipped}</td></tr>`
    ).join("");
  }

  // ------------------------------------------------------------------------------------------- start
  $("title").textContent = "grpokit view: " + RUNS.map((r) => r.name).join(" vs ");
  fillRuns();
  fillHistory();
  showTab(["#steps", "#history"].includes(location.hash) ? location.hash.slice(1) : "curves");
})();
