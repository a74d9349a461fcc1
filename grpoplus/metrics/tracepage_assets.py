"""The trace page's inline style and script (:mod:`grpoplus.metrics.tracepage`), kept apart from the Python that
fills the page. The script reads the JSON in ``<script id="data">``, draws the samples' table, applies the filters
(and keeps them in the URL fragment) and draws the chosen sample's tokens."""

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.2em}
#controls{margin:.6em 0;padding:.5em;background:#f4f4f4;border-radius:4px}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:2px 6px;text-align:left;
vertical-align:top}tr.sample{cursor:pointer}tr.sample:hover{background:#eef}tr.chosen{background:#dde}
td.text{font-family:monospace;white-space:pre-wrap;max-width:40em;overflow:hidden}
#detail{margin-top:1em}.tokens{font-family:monospace;white-space:pre-wrap;line-height:1.9;border:1px solid #ccc;
padding:.5em}.tok{border-radius:2px;padding:1px 0;margin-right:1px}.prompt{color:#888}
.k-loss{background:#bcd7f5}.k-noloss{background:#e6ecf3}.k-env{background:#f8d49a}.k-tool{background:#c9e8c0}
#legend span{margin-right:1em;padding:1px 4px}#controls input{width:6em}#controls select{width:auto}
"""

SCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById('data').textContent);
  const rows = data.rows;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
  const text = (id) => data.vocab ? (data.vocab[id] !== undefined ? data.vocab[id] : '<' + id + '>') : id + ' ';
  const advOf = (r) => Array.isArray(r.advantage) ? r.advantage : r.response_ids.map(() => r.advantage);
  const meanAdv = (r) => {
    if (r.advantage === null) return null;
    if (!Array.isArray(r.advantage)) return r.advantage;
    const a = r.advantage.filter((_, i) => r.mask[i] === '1');
    return a.length ? a.reduce((x, y) => x + y, 0) / a.length : 0;
  };
  const gaps = (r) => r.logp_learner_e6 === null ? null :
    r.logp_engine_e6.map((e, i) => r.mask[i] === '1' ? (e - r.logp_learner_e6[i]) / 1e6 : 0);
  const maxGap = (r) => { const g = gaps(r); return g === null ? null : Math.max(0, ...g.map(Math.abs)); };
  const fmt = (x, d) => x === null || x === undefined ? '-' : Number(x).toFixed(d);

  function state() {
    const s = {status: 'all', min: '', max: '', colour: 'mask', row: ''};
    for (const part of location.hash.replace(/^#/, '').split('&')) {
      const [k, v] = part.split('=');
      if (k in s && v !== undefined) s[k] = decodeURIComponent(v);
    }
    return s;
  }
  function save(s) {
    const hash = Object.entries(s).filter(([k, v]) => v !== '' && !(k === 'status' && v === 'all') &&
      !(k === 'colour' && v === 'mask')).map(([k, v]) => k + '=' + encodeURIComponent(v)).join('&');
    history.replaceState(null, '', hash ? '#' + hash : location.pathname + location.search);
  }
  function keep(r, s) {
    const ok = {all: true, correct: r.correct, incorrect: !r.correct, truncated: r.finish === 'length',
                error: r.finish === 'error', failed: !r.correct || r.finish === 'error',
                unscored: r.scored === false}[s.status];
    return ok && (s.min === '' || r.reward >= Number(s.min)) && (s.max === '' || r.reward <= Number(s.max));
  }

  function table(s) {
    const body = $('samples').tBodies[0];
    body.innerHTML = rows.map((r) => '<tr class="sample" data-row="' + r.row + '" data-finish="' + r.finish +
      '"><td>' + r.row + '</td><td>' + r.group + '</td><td>' + fmt(r.reward, 3) + '</td><td>' + r.correct +
      '</td><td>' + r.finish + (r.end ? ' (' + esc(r.end) + ')' : '') + '</td><td>' + fmt(meanAdv(r), 3) +
      '</td><td>' + r.response_ids.length + '</td><td>' + (maxGap(r) === null ? '-' : maxGap(r).toExponential(1)) +
      '</td><td>' + r.version +
      '</td><td class="text">' + esc(r.text.slice(0, 160)) + '</td></tr>').join('');
    for (const tr of body.rows) tr.addEventListener('click', () => { s.row = tr.dataset.row; apply(s); });
  }

  function colour(r, i, s, adv, gap, scale) {
    if (s.colour === 'mask') return {cls: r.mask[i] === '0' ? 'k-env' : r.mask[i] === 't' ? 'k-tool' :
      (r.loss_mask && r.loss_mask[i] === '0' ? 'k-noloss' : 'k-loss'), bg: ''};
    const v = s.colour === 'advantage' ? adv[i] : (gap ? Math.abs(gap[i]) : 0);
    const t = Math.min(1, Math.abs(v) / (scale || 1));
    const hue = s.colour === 'advantage' ? (v >= 0 ? '120' : '0') : '0';
    return {cls: '', bg: 'background:hsla(' + hue + ',80%,55%,' + (0.1 + 0.8 * t).toFixed(2) + ')'};
  }

  function detail(s) {
    const r = rows.find((x) => String(x.row) === s.row);
    if (!r) { $('detail').innerHTML = '<p>Click a sample to see its tokens.</p>'; return; }
    const adv = r.advantage === null ? r.response_ids.map(() => 0) : advOf(r);
    const gap = gaps(r);
    const scale = s.colour === 'advantage' ? Math.max(1e-9, ...adv.map(Math.abs)) :
      Math.max(1e-6, ...(gap || [0]).map(Math.abs));
    const prompt = r.prompt_ids.map((id) => '<span class="tok prompt" title="prompt id ' + id + '">' +
      esc(text(id)) + '</span>').join('');
    const response = r.response_ids.map((id, i) => {
      const c = colour(r, i, s, adv, gap, scale);
      const tip = 'id ' + id + (r.mask[i] === '1' ? ' | engine ' + r.logp_engine_e6[i] / 1e6 + ' | learner ' +
        (r.logp_learner_e6 ? r.logp_learner_e6[i] / 1e6 : '-') : r.mask[i] === 't' ? ' | tool result token' :
        ' | environment token') + ' | advantage ' +
        fmt(adv[i], 4);
      return '<span class="tok ' + c.cls + '" style="' + c.bg + '" title="' + tip + '">' + esc(text(id)) + '</span>';
    }).join('');
    const parts = Object.entries(r.rewards).map(([k, v]) => k + ' ' + fmt(v, 3)).join(', ');
    $('detail').innerHTML = '<h2>row ' + r.row + ' (group ' + r.group + ', prompt ' + r.prompt_index + ')</h2><p>' +
      'reward ' + fmt(r.reward, 4) + ' (' + esc(parts) + '), finish ' + r.finish + ', version ' + r.version +
      (r.trained ? '' : ', not trained on') + (r.scored === false ? ', no score (left out of its group)' : '') +
      '</p><div class="tokens">' + prompt + response + '</div>';
  }

  function legend(s) {
    $('legend').innerHTML = s.colour === 'mask' ? '<span class="k-loss">policy token, with loss</span>' +
      '<span class="k-noloss">policy token, no loss (filtered)</span><span class="k-tool">tool result token</span>' +
      '<span class="k-env">environment token</span>' :
      s.colour === 'advantage' ? 'green: positive advantage, red: negative (intensity: |A| / the sample\'s largest)' :
      'red intensity: |engine - learner| log-prob of the token / the sample\'s largest gap';
  }

  function apply(s) {
    let shown = 0;
    for (const tr of $('samples').tBodies[0].rows) {
      const visible = keep(rows[Number(tr.dataset.row)], s);
      tr.hidden = !visible;
      tr.classList.toggle('chosen', tr.dataset.row === s.row);
      shown += visible;
    }
    $('count').textContent = shown + ' of ' + rows.length + ' samples shown';
    document.body.dataset.shown = shown;
    for (const k of ['status', 'min', 'max', 'colour']) $(k).value = s[k];
    legend(s);
    detail(s);
    save(s);
  }

  $('about').textContent = rows.length + ' samples of step ' + data.step + ' (traced steps: ' + data.steps +
    '); ' + data.note + '.';
  const s = state();
  table(s);
  for (const k of ['status', 'min', 'max', 'colour']) $(k).addEventListener('input', () => { s[k] = $(k).value; apply(s); });
  window.addEventListener('hashchange', () => { Object.assign(s, state()); apply(s); });
  apply(s);
})();
"""
