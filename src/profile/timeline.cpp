#include "profile/timeline.hpp"

#include <fstream>

namespace libreyolo::profile {

namespace {

// The page. @@PAYLOAD@@ is replaced by the JSON payload (with "</" escaped).
const char* kPage = R"LYP(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>LibreYOLO profile timeline</title>
<style>
:root{--bg:#101216;--fg:#d8dce3;--dim:#8a919c;--line:#252a33;--panel:#171a20}
*{box-sizing:border-box}
html,body{margin:0;height:100%;background:var(--bg);color:var(--fg);font:13px/1.35 system-ui,-apple-system,"Segoe UI",sans-serif}
#top{height:34px;display:flex;align-items:center;gap:14px;padding:0 10px;border-bottom:1px solid var(--line);white-space:nowrap;overflow:hidden}
#top b{color:#fff}
.key{display:inline-flex;align-items:center;gap:4px;color:var(--dim);font-size:12px}
.key i{width:10px;height:10px;border-radius:2px;display:inline-block}
#hint{color:var(--dim);font-size:12px;overflow:hidden;text-overflow:ellipsis;min-width:0;flex-shrink:1}
#legend{min-width:0;overflow:hidden;flex-shrink:1}
#toggle{flex:none;margin-left:auto;background:#2a2f39;color:var(--fg);border:0;border-radius:4px;padding:4px 10px;cursor:pointer}
#main{position:absolute;top:34px;left:0;right:0;bottom:0;display:flex}
#view{position:relative;flex:1;overflow-y:auto;overflow-x:hidden}
canvas{display:block}
#panel{width:300px;flex:none;background:var(--panel);border-left:1px solid var(--line);padding:12px 14px;overflow-y:auto}
#panel.hidden{display:none}
#badge{border-radius:6px;padding:8px;text-align:center;font-weight:700;color:#fff;letter-spacing:.03em}
#big{font-size:28px;font-weight:700;margin:8px 0 2px}
.sub{color:var(--dim);font-size:12px}
#why{margin:8px 0;font-size:12px}
#lever{font-size:12px;color:#e6c07b;margin-bottom:6px}
h3{font-size:13px;margin:14px 0 6px}
.bar{display:grid;grid-template-columns:110px 1fr 46px;gap:6px;align-items:center;font-size:12px;margin:3px 0}
.bar span.track{height:8px;background:#2a2f39;border-radius:3px;overflow:hidden}
.bar span.fill{display:block;height:100%}
.bar .pct{text-align:right;color:var(--dim)}
table{border-collapse:collapse;width:100%;font-size:12px}
td{padding:2px 4px 2px 0;vertical-align:top}
td.n{text-align:right;color:var(--dim);white-space:nowrap}
td.k{max-width:150px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
#tip{position:fixed;pointer-events:none;background:#000d;border:1px solid #444;border-radius:4px;padding:4px 6px;font-size:12px;display:none;max-width:520px;word-break:break-all;z-index:5}
#lyp-status{display:none}
</style></head>
<body>
<div id="top"><span>LibreYOLO profiler &mdash; <b id="model"></b> <span id="info" class="sub"></span></span>
<span id="legend"></span><span id="hint">wheel = zoom &middot; drag = pan &middot; double-click = reset</span>
<button id="toggle">hide analysis</button></div>
<div id="main"><div id="view"><canvas id="cv"></canvas></div>
<div id="panel"><div id="badge"></div><div id="big"></div><div id="lines"></div><div id="why"></div><div id="lever"></div>
<h3>kernel mix</h3><div id="mix"></div><h3>top kernels / step</h3><table id="topk"></table>
<h3>phases / step</h3><table id="phases"></table></div></div>
<div id="tip"></div><div id="lyp-status">loading</div>
<script type="application/json" id="lyp-data">@@PAYLOAD@@</script>
<script>
(function(){
"use strict";
var status=document.getElementById("lyp-status");
window.addEventListener("error",function(e){status.textContent="error: "+(e.message||e);});
var D=JSON.parse(document.getElementById("lyp-data").textContent);
var A=D.analysis||{}, M=D.meta||{};
var PHASE={dataload:"#e8893a",to_device:"#d8c23a",forward:"#3a8ee8",loss:"#e85c9a",backward:"#9a5ce8",optimizer:"#3ac47a",preprocess:"#5cc8d8",postprocess:"#c8a05c"};
var CAT={"gemm / conv":"#3a8ee8","reduction / norm":"#1fb58f","elementwise":"#9a5ce8","layout / copy":"#e8893a","other":"#7d8591",memcpy:"#e0504a",memset:"#b8403a",op:"#8b95a5",step:"#5a6270"};
var LANES=["step","phase \u00b7 CPU","CPU ops","phase \u00b7 GPU","GPU kernels","GPU memcpy"];
var ROWH=13, LANEPAD=8, LEFT=112, AXIS=24;
function el(id){return document.getElementById(id);}
function txt(id,s){el(id).textContent=s;}
function fmt(v,d){return (v===null||v===undefined||isNaN(v))?"-":Number(v).toFixed(d);}
function color(e){if(e.lane.indexOf("phase")===0)return PHASE[e.cat]||"#aaa";return CAT[e.cat]||"#aaa";}
// header
txt("model",M.model||"model");
var info=[];if(M.batch!==undefined)info.push("batch "+M.batch);if(M.imgsz!==undefined)info.push("imgsz "+M.imgsz);
if(M.device)info.push(M.device);if(M.amp!==undefined)info.push(M.amp?("amp "+(M.amp_dtype||"")):"fp32");
info.push(D.events.length+" events");txt("info","\u00b7 "+info.join(" \u00b7 "));
var lg=el("legend");
[["forward",PHASE.forward],["loss",PHASE.loss],["backward",PHASE.backward],["optimizer",PHASE.optimizer],["dataload",PHASE.dataload],["kernel",CAT["gemm / conv"]],["memcpy",CAT.memcpy]].forEach(function(k){
 var s=document.createElement("span");s.className="key";var i=document.createElement("i");i.style.background=k[1];s.appendChild(i);s.appendChild(document.createTextNode(k[0]));lg.appendChild(s);lg.appendChild(document.createTextNode(" "));});
// lanes
var rows=D.lane_rows||{}, lanes=[], y=AXIS;
LANES.forEach(function(n){var r=rows[n]||0; if(!r)return; var shown=Math.max(1,Math.min(r,n==="CPU ops"?10:(n==="GPU kernels"?6:8)));
 lanes.push({name:n,y:y,rows:shown,h:shown*ROWH}); y+=shown*ROWH+LANEPAD;});
var laneBy={};lanes.forEach(function(l){laneBy[l.name]=l;});
var H=y+10, total=Math.max(D.total_ms||0,0.001);
var cv=el("cv"), ctx=cv.getContext("2d"), view=el("view");
var v0=0, v1=total, W=800, dpr=window.devicePixelRatio||1;
function size(){W=Math.max(200,view.clientWidth);cv.width=W*dpr;cv.height=H*dpr;cv.style.width=W+"px";cv.style.height=H+"px";ctx.setTransform(dpr,0,0,dpr,0,0);}
function X(t){return LEFT+(t-v0)/(v1-v0)*(W-LEFT-8);}
function T(x){return v0+(x-LEFT)/(W-LEFT-8)*(v1-v0);}
function tick(span){var s=Math.pow(10,Math.floor(Math.log10(span/6)));if(span/s>30)s*=5;else if(span/s>12)s*=2;return s;}
var drawn=0;
function draw(){
 ctx.fillStyle="#101216";ctx.fillRect(0,0,W,H);
 var st=tick(v1-v0);ctx.font="11px system-ui,sans-serif";ctx.textBaseline="middle";
 for(var t=Math.ceil(v0/st)*st;t<=v1;t+=st){var x=X(t);ctx.fillStyle="#1e232b";ctx.fillRect(x,AXIS,1,H-AXIS);ctx.fillStyle="#8a919c";ctx.fillText((st<1?t.toFixed(2):t.toFixed(0))+" ms",x+3,12);}
 lanes.forEach(function(l){ctx.fillStyle="#14171c";ctx.fillRect(0,l.y,LEFT-4,l.h);ctx.fillStyle="#c9ced6";ctx.fillText(l.name,6,l.y+Math.min(l.h,ROWH)/2);
  ctx.fillStyle="#252a33";ctx.fillRect(LEFT,l.y+l.h+LANEPAD/2,W-LEFT,1);});
 drawn=0;
 ctx.save();ctx.beginPath();ctx.rect(LEFT,AXIS,W-LEFT,H-AXIS);ctx.clip();
 for(var i=0;i<D.events.length;i++){var e=D.events[i],l=laneBy[e.lane];if(!l)continue;
  if(e.t>v1||e.t+e.d<v0)continue;var r=e.row%l.rows;var x=X(e.t),w=Math.max(1,X(e.t+e.d)-x);
  ctx.fillStyle=color(e);ctx.fillRect(x,l.y+r*ROWH+1,w,ROWH-2);drawn++;
  if(w>40&&(e.lane.indexOf("phase")===0||e.lane==="step")){ctx.fillStyle="#0b0d10";ctx.fillText(e.name.slice(0,Math.floor(w/6)),x+3,l.y+r*ROWH+ROWH/2);}}
 var fl=D.flows||[],a=laneBy["CPU ops"],b=laneBy["GPU kernels"];
 if(a&&b){var vis=[];for(var j=0;j<fl.length;j++){if(fl[j][1]>=v0&&fl[j][0]<=v1)vis.push(fl[j]);}
  if(vis.length<=400){ctx.strokeStyle="rgba(160,180,210,.25)";ctx.beginPath();vis.forEach(function(f){ctx.moveTo(X(f[0]),a.y+a.h);ctx.lineTo(X(f[1]),b.y);});ctx.stroke();}}
 ctx.restore();
}
// interaction
var drag=null;
cv.addEventListener("wheel",function(ev){ev.preventDefault();var r=cv.getBoundingClientRect(),x=ev.clientX-r.left;if(x<LEFT)return;
 var t=T(x),f=ev.deltaY>0?1.2:1/1.2;var n0=t-(t-v0)*f,n1=t+(v1-t)*f;if(n1-n0<1e-4)return;v0=n0;v1=n1;draw();},{passive:false});
cv.addEventListener("mousedown",function(ev){drag={x:ev.clientX,v0:v0,v1:v1};});
window.addEventListener("mouseup",function(){drag=null;});
window.addEventListener("mousemove",function(ev){var tip=el("tip");
 if(drag){var dt=(ev.clientX-drag.x)/(W-LEFT-8)*(drag.v1-drag.v0);v0=drag.v0-dt;v1=drag.v1-dt;draw();tip.style.display="none";return;}
 var r=cv.getBoundingClientRect(),x=ev.clientX-r.left,yy=ev.clientY-r.top;if(ev.target!==cv||x<LEFT){tip.style.display="none";return;}
 var hit=null;lanes.forEach(function(l){if(yy>=l.y&&yy<l.y+l.h){var row=Math.floor((yy-l.y)/ROWH),t=T(x),tol=(v1-v0)/(W-LEFT)*2;
  for(var i=0;i<D.events.length;i++){var e=D.events[i];if(e.lane===l.name&&e.row%l.rows===row&&t>=e.t-tol&&t<=e.t+e.d+tol){if(!hit||e.d<hit.d)hit=e;}}}});
 if(!hit){tip.style.display="none";return;}
 tip.textContent=hit.name+"  \u00b7  "+fmt(hit.d,4)+" ms  @ "+fmt(hit.t,3)+" ms  ["+hit.cat+"]";tip.style.left=(ev.clientX+12)+"px";tip.style.top=(ev.clientY+12)+"px";tip.style.display="block";});
cv.addEventListener("dblclick",function(){v0=0;v1=total;draw();});
el("toggle").addEventListener("click",function(){var p=el("panel");p.classList.toggle("hidden");el("toggle").textContent=p.classList.contains("hidden")?"show analysis":"hide analysis";size();draw();});
window.addEventListener("resize",function(){size();draw();});
// panel
function panel(){
 if(A.gpu_util===undefined||A.gpu_util===null){el("panel").classList.add("hidden");el("toggle").style.display="none";return;}
 var bc={"dataloader":"#c8641e","host / launch":"#c8501e","compute":"#2e8b57","memory-pressure":"#b8323a"}[A.bound]||"#555";
 var b=el("badge");b.style.background=bc;b.textContent=(A.bound_label||A.bound||"?").toUpperCase();
 var cpu=A.busy_source==="cpu_ops";
 txt("big",(cpu?"CPU ops ":"GPU ")+Math.round(A.gpu_util*100)+"%");
 var lines=[fmt(A.gpu_busy_ms_per_step,2)+" ms busy / "+fmt(A.step_ms,1)+" ms step \u00b7 "+fmt(A.img_per_s,2)+" img/s"];
 if(!cpu)lines.push(fmt(A.kernels_per_step,0)+" kernels/step @ ~"+fmt(A.mean_kernel_us,0)+" \u00b5s \u00b7 memcpy "+fmt(A.memcpy_ms_per_step,3)+" ms");
 else lines.push(fmt(A.ops_per_step,0)+" CPU ops/step");
 if(A.dataload_ms!==undefined&&A.dataload_ms!==null)lines.push("dataload "+fmt(A.dataload_ms,2)+" ms/step");
 if(!cpu)lines.push("peak VRAM "+fmt(A.peak_vram_mb,1)+" MB \u00b7 Tensor Cores "+fmt(A.tensorcore_pct,1)+"% of GPU");
 var ln=el("lines");lines.forEach(function(s){var d=document.createElement("div");d.className="sub";d.textContent=s;ln.appendChild(d);});
 txt("why",A.bound_why||"");txt("lever",A.lever?("lever: "+A.lever):"");
 var mix=el("mix");(A.categories||[]).forEach(function(c){var r=document.createElement("div");r.className="bar";
  var n=document.createElement("span");n.textContent=c.name;var tr=document.createElement("span");tr.className="track";var f=document.createElement("span");f.className="fill";
  f.style.width=Math.min(100,c.pct)+"%";f.style.background=CAT[c.name]||"#888";tr.appendChild(f);var p=document.createElement("span");p.className="pct";p.textContent=fmt(c.pct,1)+"%";
  r.appendChild(n);r.appendChild(tr);r.appendChild(p);mix.appendChild(r);});
 if(!(A.categories||[]).length){mix.textContent=cpu?"no GPU kernels (CPU run)":"no kernels";}
 if(!(A.top_kernels||[]).length){el("topk").previousElementSibling.style.display="none";}
 var tk=el("topk");(A.top_kernels||[]).forEach(function(k){var tr=document.createElement("tr");
  [[k.name||k.kernel,"k"],[fmt(k.ms!==undefined?k.ms:k.ms_per_step,2)+"ms","n"],[fmt(k.pct!==undefined?k.pct:k.pct_of_gpu,1)+"%","n"]].forEach(function(c){var td=document.createElement("td");td.className=c[1];td.textContent=c[0];td.title=k.raw_name||c[0];tr.appendChild(td);});tk.appendChild(tr);});
 var ph=el("phases");(A.phases||[]).forEach(function(p){var tr=document.createElement("tr");
  [[p.phase,"k"],["wall "+fmt(p.wall_ms_per_step,2),"n"],cpu?["ops "+fmt(p.ops_per_step,0),"n"]:["gpu "+fmt(p.gpu_ms_per_step,2),"n"]].forEach(function(c){var td=document.createElement("td");td.className=c[1];td.textContent=c[0];tr.appendChild(td);});ph.appendChild(tr);});
}
panel();size();draw();
status.textContent="drawn lanes="+lanes.length+" events="+D.events.length+" visible="+drawn;
})();
</script>
</body></html>
)LYP";

}  // namespace

std::string timeline_html(const nlohmann::json& payload) {
  std::string data = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Inside <script> a "</script" or "<!--" would end or confuse the element: every '<' (which in
  // JSON only occurs inside strings) is written as the escape \u003c.
  std::string esc;
  esc.reserve(data.size() + 64);
  for (char c : data) {
    if (c == '<')
      esc += "\\u003c";
    else
      esc += c;
  }
  std::string page = kPage;
  const std::string mark = "@@PAYLOAD@@";
  page.replace(page.find(mark), mark.size(), esc);
  return page;
}

bool write_timeline(const std::string& path, const nlohmann::json& payload) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return false;
  out << timeline_html(payload);
  return static_cast<bool>(out);
}

}  // namespace libreyolo::profile
