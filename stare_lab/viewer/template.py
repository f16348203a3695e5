"""The page's HTML shell, CSS and script (inline: the page opens from disk with no network).

The script reads the JSON in <script id="data" type="application/json">, builds one <span class="tok">
per valid token of every rollout of the chosen arm, and recolours them when a signal or rule button
is pressed. It sets <body data-ok="1"> when it finished; an error lands in <body data-error> and
#errors (the browser test reads both).
"""

CSS = r"""
body{font:13px/1.45 system-ui,sans-serif;margin:0;padding:12px 18px;color:#222;background:#fff}
h1{font-size:18px;margin:4px 0}h2{font-size:15px;margin:18px 0 6px}
.sub{color:#666}#errors{color:#b00;font-weight:bold}
#controls{position:sticky;top:0;background:#fff;padding:6px 0;border-bottom:1px solid #ddd;z-index:2}
#controls .lbl{font-weight:600;margin-right:4px}
button.ctl{margin:2px;padding:2px 7px;border:1px solid #bbb;background:#f7f7f7;border-radius:3px;cursor:pointer;font:12px system-ui}
button.ctl.on{background:#333;color:#fff;border-color:#333}button.ctl:disabled{color:#aaa;text-decoration:line-through;cursor:not-allowed}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.na{color:#999}.params{font:11px monospace;color:#555;max-width:360px;word-break:break-all}
#rollouts{max-height:62vh;overflow:auto;border:1px solid #ddd;padding:0 6px}
.group{border-top:2px solid #ccc;margin-top:6px;padding-top:4px}.group:first-child{border-top:0}
.prompt{white-space:pre-wrap;font:12px monospace;background:#f6f6f6;padding:3px 6px;margin:2px 0}
.rollout{margin:3px 0 3px 10px;display:flex;gap:10px}.meta{flex:0 0 150px;color:#555;font:11px monospace;white-space:pre}
.tokens{font:12.5px/1.9 monospace;white-space:pre-wrap;word-break:break-all}
.tok{border-radius:2px;padding:0 .5px}.tok:empty{padding:0 2px}.tok.off{opacity:.45}.tok.sel{box-shadow:inset 0 -2px 0 #222}
#tip{position:fixed;display:none;background:#222;color:#fff;font:11px monospace;padding:4px 6px;border-radius:3px;
pointer-events:none;z-index:5;white-space:pre}
.legend{font-size:12px;color:#444;margin:4px 0}.tk{font:11px monospace;background:#eef;padding:0 2px;margin:0 2px}
"""

SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('data').textContent);
function bytes(s){const b=atob(s),u=new Uint8Array(b.length);for(let i=0;i<b.length;i++)u[i]=b.charCodeAt(i);return u;}
function f32(s){return new Float32Array(bytes(s).buffer);}
function i32(s){return new Int32Array(bytes(s).buffer);}
function el(tag,attrs,text){const e=document.createElement(tag);if(attrs)for(const k in attrs)e.setAttribute(k,attrs[k]);
  if(text!==undefined)e.textContent=text;return e;}
function fmt(x,d){return x===null||x===undefined||Number.isNaN(x)?'–':Number(x).toFixed(d===undefined?3:d);}
function vis(p){return p.replace(/\n/g,'\u21b5\n').replace(/\t/g,'\u21e5');}
const utf8=new TextEncoder();
// a row's text one token at a time (batch.Batch.token_pieces): a character split over byte-level tokens
// appears at the token that completes it; raw pieces are shown on hover
function rowTexts(ids,off,len){const d=new TextDecoder('utf-8'),out=[];
  for(let j=0;j<len;j++){const id=ids[off+j],bp=arm.byte_pieces[id];
    out.push(d.decode(bp?new Uint8Array(bp[1]):utf8.encode(arm.vocab[id]??('<'+id+'>')),{stream:true}));}
  if(len)out[len-1]+=d.decode();return out;}
let arm=null, spans=[], current={kind:'signal',key:null};
const cache=new Map();
function decoded(a){
  if(cache.has(a))return cache.get(a);
  const c={ids:i32(a.ids),signals:{},rules:{}};
  for(const s of a.signals)c.signals[s.key]=f32(s.values);
  for(const r of a.rules)if(r.computable)c.rules[r.key]={w:f32(r.weights),sel:bytes(r.selected)};
  cache.set(a,c);return c;
}
function controls(){
  const box=document.getElementById('controls');box.textContent='';
  if(D.arms.length>1){box.appendChild(el('span',{class:'lbl'},'Arm:'));
    D.arms.forEach((a,i)=>{const b=el('button',{class:'ctl'+(a===arm?' on':''),'data-kind':'arm','data-key':String(i)},a.label);
      b.onclick=()=>show(i);box.appendChild(b);});box.appendChild(el('br'));}
  box.appendChild(el('span',{class:'lbl'},'Signal:'));
  for(const s of arm.signals){const b=el('button',{class:'ctl','data-kind':'signal','data-key':s.key,title:s.label},s.label);
    b.onclick=()=>paint('signal',s.key);box.appendChild(b);}
  box.appendChild(el('br'));box.appendChild(el('span',{class:'lbl'},'Rule weight:'));
  for(const r of arm.rules){const b=el('button',{class:'ctl','data-kind':'rule','data-key':r.key,
      title:r.computable?('selected '+fmt(100*r.selected_frac,1)+'%'):r.reason},r.label);
    if(!r.computable)b.disabled=true;b.onclick=()=>paint('rule',r.key);box.appendChild(b);}
  box.appendChild(el('div',{class:'legend',id:'legend'}));
}
function summary(){
  const t=document.getElementById('rules');t.textContent='';
  const h=el('tr');for(const c of['rule','params','normalize','trained','touched','selected','weight mean','positions (start → end)','most selected tokens'])h.appendChild(el('th',null,c));
  t.appendChild(h);
  for(const r of arm.rules){const tr=el('tr',{'data-rule':r.key});
    const replay=r.reproduces_training===true?'replayed on the record: the same weights':(r.reproduces_training===false?r.replay_note:(r.replay_note||''));
    tr.appendChild(el('td',replay?{title:replay}:null,r.label+(r.reproduces_training===false?' ⚠':'')));
    tr.appendChild(el('td',{class:'params'},JSON.stringify(r.params)));
    if(!r.computable){tr.appendChild(el('td',{class:'na',colspan:'7'},r.reason));t.appendChild(tr);continue;}
    tr.appendChild(el('td',null,r.normalize));
    tr.appendChild(el('td',{class:'num',title:'weight ≠ 0'},fmt(100*r.trained_frac,1)+'%'));
    tr.appendChild(el('td',{class:'num',title:'weight ≠ 1, or changed by the rule\'s loss'},fmt(100*r.touched_frac,1)+'%'));
    tr.appendChild(el('td',{class:'num'},fmt(100*r.selected_frac,1)+'%'));
    tr.appendChild(el('td',{class:'num'},fmt(r.weight_mean)));
    const td=el('td');td.appendChild(bars(r.positions));tr.appendChild(td);
    const tk=el('td');for(const [p,n,share] of r.top_tokens){const s=el('span',{class:'tk',title:n+' selected, '+fmt(100*share,0)+'% of its occurrences'},vis(p));tk.appendChild(s);}
    tr.appendChild(tk);t.appendChild(tr);}
}
function bars(counts){
  const ns='http://www.w3.org/2000/svg',W=120,H=22,m=Math.max(1,...counts),bw=W/counts.length;
  const svg=document.createElementNS(ns,'svg');svg.setAttribute('width',W);svg.setAttribute('height',H);
  counts.forEach((c,i)=>{const r=document.createElementNS(ns,'rect');const h=H*c/m;r.setAttribute('x',i*bw);
    r.setAttribute('y',H-h);r.setAttribute('width',bw-1);r.setAttribute('height',h);r.setAttribute('fill','#3182bd');svg.appendChild(r);});
  return svg;
}
function overlap(){
  const t=document.getElementById('overlap');t.textContent='';const o=arm.overlap;
  const h=el('tr');h.appendChild(el('th',null,'Jaccard'));for(const k of o.keys)h.appendChild(el('th',null,k));t.appendChild(h);
  o.keys.forEach((k,i)=>{const tr=el('tr');tr.appendChild(el('th',null,k));
    o.matrix[i].forEach(v=>{const td=el('td',{class:'num'},fmt(v,2));td.style.background='rgba(49,130,189,'+(0.8*v).toFixed(3)+')';tr.appendChild(td);});
    t.appendChild(tr);});
}
function rollouts(){
  const box=document.getElementById('rollouts');box.textContent='';spans=[];
  const c=decoded(arm),frag=document.createDocumentFragment();let g=null,gdiv=null;
  for(const r of arm.rollouts){
    if(r.group!==g){g=r.group;gdiv=el('div',{class:'group','data-group':String(g)});
      gdiv.appendChild(el('div',{class:'sub'},'prompt (group '+g+')'));gdiv.appendChild(el('div',{class:'prompt'},arm.prompts[r.prompt]));frag.appendChild(gdiv);}
    const row=el('div',{class:'rollout','data-row':String(r.row)});
    row.appendChild(el('div',{class:'meta'},'#'+r.row+'  reward '+fmt(r.reward,2)+'\nA '+fmt(r.advantage,3)+'  '+r.length+' tok'));
    const toks=el('div',{class:'tokens'});
    const texts=rowTexts(c.ids,r.offset,r.length);
    for(let j=0;j<r.length;j++){const i=r.offset+j;const s=document.createElement('span');s.className='tok';
      s.textContent=vis(texts[j]);s._text=texts[j];s._i=i;s._t=j;s._r=r.row;toks.appendChild(s);spans.push(s);}
    row.appendChild(toks);gdiv.appendChild(row);}
  box.appendChild(frag);
}
function paint(kind,key){
  current={kind,key};const c=decoded(arm);
  document.querySelectorAll('button.ctl').forEach(b=>b.classList.toggle('on',(b.dataset.kind===kind&&b.dataset.key===key)||(b.dataset.kind==='arm'&&D.arms[+b.dataset.key]===arm)));
  const lg=document.getElementById('legend');
  if(kind==='signal'){const s=arm.signals.find(x=>x.key===key),v=c.signals[key],span=(s.hi-s.lo)||1;
    lg.textContent=s.label+': white = '+fmt(s.lo)+' … orange = '+fmt(s.hi)+' (99th percentile). Hover a token for its values.';
    for(const e of spans){const t=Math.min(1,Math.max(0,(v[e._i]-s.lo)/span));e.className='tok';
      e.style.background='rgba(230,85,13,'+(0.85*t).toFixed(3)+')';}
  }else{const r=arm.rules.find(x=>x.key===key),w=c.rules[key].w,sel=c.rules[key].sel;
    lg.textContent=r.label+': '+(r.binary?'blue = weight 1 (selected), faded = weight 0':'orange = weight > 1, blue = 0 < weight < 1, faded = 0')+'; underline = in the selected set ('+fmt(100*r.selected_frac,1)+'% of tokens).';
    const mx=Math.max(1.0001,r.weight_max);
    for(const e of spans){const x=w[e._i];let bg='transparent';
      if(x>0){if(r.binary)bg='rgba(49,130,189,.55)';else if(x>1)bg='rgba(230,85,13,'+(0.25+0.6*Math.min(1,(x-1)/(mx-1))).toFixed(3)+')';
        else if(x<1)bg='rgba(49,130,189,'+(0.15+0.6*(1-x)).toFixed(3)+')';else bg='rgba(0,0,0,.04)';}
      e.className='tok'+(x===0?' off':'')+(sel[e._i]?' sel':'');e.style.background=bg;}
  }
}
function tip(ev){
  const tp=document.getElementById('tip'),s=ev.target;if(!s.classList||!s.classList.contains('tok')){tp.style.display='none';return;}
  const c=decoded(arm),i=s._i,bp=arm.byte_pieces[c.ids[i]];
  let lines=['row '+s._r+'  t='+s._t+'  '+JSON.stringify(s._text)+(bp?'  raw piece '+JSON.stringify(bp[0])+' (bytes '+bp[1].map(b=>b.toString(16).padStart(2,'0')).join(' ')+')':'')];
  for(const g of arm.signals)lines.push(g.label+': '+fmt(c.signals[g.key][i],4));
  if(current.kind==='rule'){const r=c.rules[current.key];lines.push(current.key+' weight: '+fmt(r.w[i],4)+(r.sel[i]?' (selected)':''));}
  tp.textContent=lines.join('\n');tp.style.display='block';tp.style.left=(ev.clientX+12)+'px';tp.style.top=(ev.clientY+12)+'px';
}
function show(i){
  arm=D.arms[i];
  document.getElementById('title').textContent=arm.label+' — step '+arm.step;
  document.getElementById('info').textContent=arm.info;
  document.getElementById('missing').textContent=(D.missing||[]).length?('Not on this page: '+D.missing.map(m=>m.label+' ('+m.reason+')').join('; ')):'';
  controls();summary();overlap();rollouts();
  const own=arm.rules.find(r=>r.own&&r.computable);
  if(own)paint('rule',own.key);else if(arm.signals.length)paint('signal',arm.signals[0].key);
}
document.getElementById('rollouts').addEventListener('mouseover',tip);
document.getElementById('rollouts').addEventListener('mouseleave',()=>{document.getElementById('tip').style.display='none';});
show(0);
document.body.setAttribute('data-render-ms',performance.now().toFixed(0));  // read by benchmarks/viewer_speed.py
document.body.setAttribute('data-ok','1');
})();
"""

HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<script>window.onerror=function(m,src,l,c,e){{document.body.setAttribute('data-error',String(m)+' at '+l+':'+c);
var d=document.getElementById('errors');if(d)d.textContent='script error: '+m+' (line '+l+')';}};</script>
<style>{css}</style></head>
<body>
<div id="errors"></div>
<h1 id="title">{title}</h1>
<div class="sub" id="info"></div>
<div class="sub" id="missing"></div>
<div id="controls"></div>
<h2>Rollouts</h2>
<div id="rollouts"></div>
<h2>Rules on this batch</h2>
<table id="rules"></table>
<h2>Overlap of the selected sets (Jaccard)</h2>
<table id="overlap"></table>
<div id="tip"></div>
<script id="data" type="application/json">{data}</script>
<script>{script}</script>
</body></html>
"""
