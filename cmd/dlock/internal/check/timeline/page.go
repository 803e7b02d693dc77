package timeline

import "html/template"

// page is the whole HTML file. html/template escapes every value by context;
// the page references nothing outside itself.
var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.bad td { background: #fde2e2; } tr.bad td.n { color: #c00; font-weight: bold; }
tr.warn td { background: #fff4d6; }
.verdict { font-weight: bold; padding: 6px 10px; display: inline-block; border-radius: 4px; }
.verdict.safe { background: #dff3df; color: #185c18; } .verdict.unsafe { background: #fde2e2; color: #a00; }
.truncated { background: #fff4d6; border: 1px solid #e0b84d; padding: 8px 10px; max-width: 70em; }
.scroll { overflow-x: auto; border: 1px solid #ddd; margin-bottom: 1em; }
.legend span { display: inline-block; margin-right: 1em; }
.legend svg.sw { display: inline-block; vertical-align: middle; margin-right: 3px; }
svg { font: 11px system-ui, sans-serif; display: block; }
svg .laneA { fill: #fafafa; } svg .laneB { fill: #f0f0f0; }
svg .key { fill: #333; }
svg .tick { stroke: #ddd; } svg .ticklabel { fill: #666; }
svg .band { fill: #f5a623; fill-opacity: .18; stroke: #f5a623; stroke-opacity: .6; }
svg .bandlabel { fill: #a0600a; }
svg .grant { fill: #fff; fill-opacity: .45; }
svg .tail { fill-opacity: .25; }
svg .lease { stroke: #0004; stroke-width: .5; }
svg .renew { fill: #fff; } svg .renewfail { fill: #000; }
svg .acc { fill: #222; } svg .rej { fill: #999; } svg .p3 { fill: #d00; }
svg .lost { stroke: #000; stroke-width: 2; }
svg .fail { fill: #888; }
svg .note { fill: #36c; }
svg .viol { fill: #d00; fill-opacity: .35; stroke: #d00; stroke-width: 1.5; }
svg .outline { fill: none; stroke: #d00; stroke-width: 2; }
svg .dashed { stroke-dasharray: 5 3; }
svg :target { stroke: #c0c !important; stroke-width: 4 !important; }
ol.violations li { margin-bottom: .4em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p><span class="verdict {{if .Safe}}safe{{else}}unsafe{{end}}">{{.Verdict}}</span>{{if .Expected}} &nbsp; expected: {{.Expected}}{{end}}</p>

<h2>Run</h2>
<table class="meta">
{{range .Meta}}<tr><th>{{index . 0}}</th><td>{{index . 1}}</td></tr>
{{end}}</table>

<h2>Checks</h2>
<table class="summary">
<tr><th>Check</th><th>Count</th><th>What it counts</th></tr>
{{range .Rows}}<tr class="{{.Class}}"><td>{{.Name}}</td><td class="n">{{.Count}}</td><td>{{.Detail}}</td></tr>
{{end}}</table>
<table class="counts">
{{range .Counts}}<tr><th>{{index . 0}}</th><td class="n">{{index . 1}}</td></tr>
{{end}}</table>
{{if .Notes}}<ul class="notes">{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}

<h2>Violation examples</h2>
{{if .Violations}}<ol class="violations">
{{range .Violations}}<li><b>{{.Check}}</b>, key {{.Key}}, at {{.At}}: {{.Detail}}{{if .Anchor}} <a href="#{{.Anchor}}">show on the timeline</a>{{end}}</li>
{{end}}</ol>{{else}}<p>None.</p>{{end}}

<h2>Timeline</h2>
<p>Time in milliseconds since the workload began. One lane per key; a bar per lease, from its last acquire attempt
to its release (or the moment it was declared lost, or its last known operation), coloured by worker; the pale
start of a bar is the acquire's uncertainty window [attempt, granted]; a faint tail after a bar that was not
released is the time the server certainly still held the key (last attempt or renewal sent, plus the hold). White ticks: renewals (black: failed).
Dark ticks: writes the store accepted; grey: writes it rejected; red: accepted writes with a stale token (P3).
Grey lines at the bottom of a lane: failed acquires. Orange bands: faults until healed. Red outlines: leases
named by a P1 or P4 violation; dashed red: a lost release window. Hover for details.</p>
<p class="legend">{{range .Workers}}<span><svg class="sw" width="12" height="10"><rect width="12" height="10" fill="{{.Color}}"/></svg>{{.Name}}</span>{{end}}</p>
{{if .Truncated}}<p class="truncated">{{.Truncated}}</p>{{end}}
{{range .Panels}}
<h3>{{.Title}}</h3>
<div class="scroll">
<svg width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img">
{{range .Lanes}}<rect class="{{if .Alternate}}laneB{{else}}laneA{{end}}" x="0" y="{{.Y}}" width="100%" height="{{.H}}"/><text class="key" x="4" y="{{.LabelY}}">{{.Key}}</text>
{{end}}{{$p := .}}{{range .Ticks}}<line class="tick" x1="{{.X}}" x2="{{.X}}" y1="{{$p.AxisY}}" y2="{{$p.Height}}"/><text class="ticklabel" x="{{.X}}" y="12" text-anchor="middle">{{.Label}}</text>
{{end}}{{range .Bands}}<g><title>{{.Title}}</title><rect class="band" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"/><text class="bandlabel" x="{{.LabelX}}" y="28">{{.Label}}</text></g>
{{end}}{{range .Lines}}<rect class="{{.Class}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Fails}}<rect class="fail" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Bars}}<g class="leasebar"{{if .ID}} id="{{.ID}}"{{end}}><title>{{.Title}}</title><rect class="lease" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}"/><rect class="grant" x="{{.X}}" y="{{.Y}}" width="{{.GrantW}}" height="{{.H}}"/>{{if .TailW}}<rect class="tail" x="{{.TailX}}" y="{{.Y}}" width="{{.TailW}}" height="{{.H}}" fill="{{.Color}}"><title>{{.TailTitle}}</title></rect>{{end}}{{if .Lost}}<line class="lost" x1="{{.LostX}}" x2="{{.LostX}}" y1="{{.LostY1}}" y2="{{.LostY2}}"/>{{end}}</g>
{{end}}{{range .Marks}}<rect class="{{.Class}}"{{if .ID}} id="{{.ID}}"{{end}} x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Outlines}}<rect class="outline{{if .Dashed}} dashed{{end}}"{{if .ID}} id="{{.ID}}"{{end}} x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Title}}</title></rect>
{{end}}</svg>
</div>
{{end}}
</body>
</html>
`))
