package main

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"

	xfont "golang.org/x/image/font"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The chart's geometry, in points: 600 points are 800 pixels at 96 dpi.
const (
	width     = vg.Length(600)
	margin    = vg.Length(10)
	rowHeight = vg.Length(19)
	barHeight = 0.62 // of a row
	labelGap  = vg.Length(4)
)

var (
	colIdem   = color.RGBA{R: 0x1f, G: 0x6f, B: 0xb4, A: 0xff}
	colPeer   = color.RGBA{R: 0xe8, G: 0x8a, B: 0x2e, A: 0xff}
	colNaive  = color.RGBA{R: 0xc8, G: 0xc8, B: 0xc8, A: 0xff}
	colHatch  = color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 0xff}
	colFailed = color.RGBA{R: 0xc0, G: 0x20, B: 0x20, A: 0xff}
	colMuted  = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	colGrid   = color.RGBA{R: 0xe4, G: 0xe4, B: 0xe4, A: 0xff}
)

// kind is how a consumer's bar is drawn.
type kind int

const (
	kindPeer  kind = iota // a way to guard a consumer without idem
	kindIdem              // an idem consumer
	kindNaive             // no guard at all
)

func kindOf(r Result) kind {
	switch {
	case !r.Guarded:
		return kindNaive
	case strings.HasPrefix(r.Key, "idem"):
		return kindIdem
	}
	return kindPeer
}

// row is one line of the chart: a broker's heading or a consumer's bar.
type row struct {
	heading string
	result  *Result
}

func rows(gs []group) []row {
	var rs []row
	for _, g := range gs {
		h := brokerName(g.Broker)
		if len(g.Results) > 0 && !g.Results[0].Absolute {
			h += " (in process: only the ratios mean something)"
		}
		rs = append(rs, row{heading: h})
		for i := range g.Results {
			rs = append(rs, row{result: &g.Results[i]})
		}
	}
	return rs
}

func face(size vg.Length, bold bool) font.Font {
	f := font.Font{Typeface: "Liberation", Variant: "Sans", Size: size}
	if bold {
		f.Weight = xfont.WeightBold
	}
	return f
}

func style(size vg.Length, bold bool, c color.Color, xa draw.XAlignment, ya draw.YAlignment) text.Style {
	return text.Style{Color: c, Font: face(size, bold), XAlign: xa, YAlign: ya, Handler: plot.DefaultTextHandler}
}

// Render draws rep's chart to w as "svg" or "png" (dpi: its pixels per inch).
func Render(w io.Writer, rep *Report, format string, dpi int) error {
	gs := groups(rep.Results)
	if len(gs) == 0 {
		return fmt.Errorf("no results")
	}
	rs := rows(gs)

	titleSty := style(12, true, color.Black, draw.XLeft, draw.YTop)
	subSty := style(8.5, false, colMuted, draw.XLeft, draw.YTop)
	top := titleSty.Height("M") + 4 + subSty.Height("M") + 8
	legendH := vg.Length(22)
	axisH := vg.Length(38)
	height := margin + top + vg.Length(len(rs))*rowHeight + axisH + legendH + margin

	var cv vg.CanvasWriterTo
	var svg *vgsvg.Canvas
	switch format {
	case "svg":
		svg = vgsvg.New(width, height)
		cv = svg
	case "png":
		cv = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi))}
	default:
		return fmt.Errorf("unknown format %q: want svg or png", format)
	}
	c := draw.New(cv)
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())
	c = draw.Crop(c, margin, -margin, margin, -margin)

	c.FillText(titleSty, vg.Point{X: c.Min.X, Y: c.Max.Y}, title(rep))
	c.FillText(subSty, vg.Point{X: c.Min.X, Y: c.Max.Y - titleSty.Height("M") - 4}, machineLine(rep, gs))

	legendC := draw.Crop(c, 0, 0, 0, -(c.Max.Y - c.Min.Y - legendH))
	plotC := draw.Crop(c, 0, 0, legendH, -top)

	newPlot(rs, plotC).Draw(plotC)
	drawLegend(legendC, rs)

	if svg == nil {
		_, err := cv.WriteTo(w)
		return err
	}
	var buf bytes.Buffer
	if _, err := svg.WriteTo(&buf); err != nil {
		return err
	}
	_, err := w.Write(fallbackFonts(buf.Bytes()))
	return err
}

// fallbackFonts lets a viewer without the Liberation fonts use one with
// the same metrics (the text is placed by them), or at least a sans-serif
// face.
func fallbackFonts(svg []byte) []byte {
	return bytes.ReplaceAll(svg, []byte("font-family:Liberation Sans;"),
		[]byte("font-family:'Liberation Sans',Arial,Helvetica,Arimo,'Nimbus Sans','Nimbus Sans L',sans-serif;"))
}

// newPlot sets up the bars' plot to fill c.
func newPlot(rs []row, c draw.Canvas) *plot.Plot {
	p := plot.New()
	p.BackgroundColor = nil
	n := len(rs)
	lo, hi := 1.0, 1.0
	for _, r := range rs {
		if v := barValue(deref(r.result)); v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
	}

	var ticks []plot.Tick
	for i, r := range rs {
		if r.result != nil {
			ticks = append(ticks, plot.Tick{Value: y(i, n), Label: r.result.Consumer})
		}
	}
	p.Y.Min, p.Y.Max = -0.5, float64(n)-0.5
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Tick.Label = style(9, false, color.Black, draw.XRight, draw.YCenter)
	p.Y.Tick.Length = 0
	p.Y.Tick.LineStyle.Width = 0
	p.Y.LineStyle.Width = 0
	p.Y.Padding = 6 // room for a viewer's wider fallback font

	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ratioTicks{upTo: niceAbove(hi)}
	p.X.Tick.Label = style(8.5, false, color.Black, draw.XCenter, draw.YTop)
	p.X.Tick.Length = 4
	p.X.Padding = 0
	p.X.Label.Text = "throughput as a multiple of the hand-rolled batched inbox (log scale)"
	p.X.Label.TextStyle = style(9, false, color.Black, draw.XCenter, draw.YBottom)
	p.X.Label.Padding = 2

	b := &bars{rows: rs, label: style(8, false, color.Black, draw.XLeft, draw.YCenter),
		heading: style(9, true, color.Black, draw.XLeft, draw.YCenter), left: c.Min.X}
	p.X.Min = niceBelow(lo / 1.5)
	p.X.Max = hi * 1.5
	// The axis must leave room right of the longest bar for its label:
	// fit it to the data area's width, which depends a little on the
	// axis' own tick labels.
	for range 3 {
		p.X.Max = b.fit(p.X.Min, hi, p.DataCanvas(c).Size().X)
	}

	grid := plotter.NewGrid()
	grid.Horizontal.Width = 0
	grid.Vertical.Color = colGrid
	grid.Vertical.Width = 0.5
	p.Add(grid, b)
	return p
}

// y is row i's coordinate: the first row at the top.
func y(i, n int) float64 { return float64(n - 1 - i) }

// niceBelow is the largest 1, 2 or 5 times a power of ten at most v.
func niceBelow(v float64) float64 {
	e := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{5, 2, 1} {
		if m*e <= v*(1+1e-9) {
			return m * e
		}
	}
	return e
}

// niceAbove is the smallest 1, 2 or 5 times a power of ten at least v.
func niceAbove(v float64) float64 {
	e := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v*(1-1e-9) {
			return m * e
		}
	}
	return 10 * e
}

func deref(r *Result) Result {
	if r == nil {
		return Result{}
	}
	return *r
}

// bars draws the rows: headings, bars and their labels, and the
// reference line at 1.
type bars struct {
	rows    []row
	label   text.Style
	heading text.Style
	left    vg.Length // where headings start: the plot's left edge
}

// fit returns the axis maximum that leaves each label room right of its
// bar, the axis starting at xmin and the data area dataW wide.
func (b *bars) fit(xmin, hi float64, dataW vg.Length) float64 {
	span := math.Log(hi / xmin)
	for _, r := range b.rows {
		if r.result == nil {
			continue
		}
		v, lw := barValue(*r.result), b.label.Width(label(*r.result))+labelGap+2
		if v <= 0 {
			continue
		}
		f := float64(lw / dataW)
		if f >= 0.9 {
			f = 0.9
		}
		span = max(span, math.Log(v/xmin)/(1-f))
	}
	return xmin * math.Exp(span) * 1.02
}

// barValue is the length of r's bar, 0 for none.
func barValue(r Result) float64 {
	if r.Error != "" || r.Ratio <= 0 {
		return 0
	}
	return r.Ratio
}

func (b *bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	n := len(b.rows)
	half := vg.Length(barHeight/2) * (trY(0) - trY(1))
	if half < 0 {
		half = -half
	}
	x0 := trX(p.X.Min)
	type caption struct {
		at  vg.Point
		sty draw.TextStyle
		s   string
	}
	var labels []caption
	for i, r := range b.rows {
		yc := trY(y(i, n))
		if r.result == nil {
			labels = append(labels, caption{vg.Point{X: b.left, Y: yc}, b.heading, r.heading})
			continue
		}
		res := *r.result
		lsty := b.label
		end := x0
		if v := barValue(res); v > 0 {
			end = trX(v)
			rect := vg.Rectangle{Min: vg.Point{X: x0, Y: yc - half}, Max: vg.Point{X: end, Y: yc + half}}
			switch kindOf(res) {
			case kindIdem:
				c.SetColor(colIdem)
				c.Fill(rect.Path())
			case kindPeer:
				c.SetColor(colPeer)
				c.Fill(rect.Path())
			case kindNaive:
				hatched(c, rect)
			}
		} else {
			lsty.Color = colFailed
		}
		labels = append(labels, caption{vg.Point{X: end + labelGap, Y: yc}, lsty, label(res)})
	}
	ref := draw.LineStyle{Color: color.Black, Width: 1, Dashes: []vg.Length{4, 2}}
	c.StrokeLine2(ref, trX(1), c.Min.Y, trX(1), c.Max.Y)
	// The labels go over the grid and the reference line, on white.
	for _, l := range labels {
		w, h := l.sty.Width(l.s), l.sty.Height(l.s)
		c.SetColor(color.White)
		c.Fill(vg.Rectangle{Min: vg.Point{X: l.at.X - 1, Y: l.at.Y - h/2}, Max: vg.Point{X: l.at.X + w + 2, Y: l.at.Y + h/2}}.Path())
		c.FillText(l.sty, l.at, l.s)
	}
}

// hatched fills rect grey, crossed by diagonal lines.
func hatched(c draw.Canvas, rect vg.Rectangle) {
	c.SetColor(colNaive)
	c.Fill(rect.Path())
	sty := draw.LineStyle{Color: colHatch, Width: 0.8}
	const step = 5
	x1, x2, y1, y2 := rect.Min.X, rect.Max.X, rect.Min.Y, rect.Max.Y
	// Lines y = x + k, clipped to the rectangle.
	for k := y1 - x2; k < y2-x1; k += step {
		lo, hi := max(x1, y1-k), min(x2, y2-k)
		if lo < hi {
			c.StrokeLine2(sty, lo, lo+k, hi, hi+k)
		}
	}
	c.StrokeLine2(draw.LineStyle{Color: colHatch, Width: 0.5}, x1, y1, x2, y1)
	c.StrokeLine2(draw.LineStyle{Color: colHatch, Width: 0.5}, x1, y2, x2, y2)
	c.StrokeLine2(draw.LineStyle{Color: colHatch, Width: 0.5}, x2, y1, x2, y2)
}

// ratioTicks labels 1, 2 and 5 times the powers of ten on a log axis
// (only the powers when it spans more than four decades), with minor
// ticks between, up to upTo: the axis goes on to make room for the
// labels of the longest bars, not for longer ones.
type ratioTicks struct{ upTo float64 }

func (t ratioTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	if t.upTo > 0 {
		hi = min(hi, t.upTo)
	}
	sparse := math.Log10(hi/lo) > 4
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		p := math.Pow10(int(e))
		for m := 1; m < 10; m++ {
			v := float64(m) * p
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || !sparse && (m == 2 || m == 5) {
				t.Label = tickLabel(v)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

func tickLabel(v float64) string {
	s := fmt.Sprintf("%.6g", v)
	return s + "×"
}

// drawLegend draws the key along c's top: the colours and the reference.
func drawLegend(c draw.Canvas, rs []row) {
	naive := false
	for _, r := range rs {
		naive = naive || r.result != nil && kindOf(*r.result) == kindNaive
	}
	sty := style(8.5, false, color.Black, draw.XLeft, draw.YCenter)
	x, yc := c.Min.X, c.Max.Y-11
	sw, sh := vg.Length(16), vg.Length(9)
	swatch := func(fill func(vg.Rectangle), name string) {
		rect := vg.Rectangle{Min: vg.Point{X: x, Y: yc - sh/2}, Max: vg.Point{X: x + sw, Y: yc + sh/2}}
		fill(rect)
		x += sw + 4
		c.FillText(sty, vg.Point{X: x, Y: yc}, name)
		x += sty.Width(name) + 14
	}
	solid := func(col color.Color) func(vg.Rectangle) {
		return func(r vg.Rectangle) { c.SetColor(col); c.Fill(r.Path()) }
	}
	swatch(solid(colIdem), "idem")
	swatch(solid(colPeer), "guarded without idem")
	if naive {
		swatch(func(r vg.Rectangle) { hatched(c, r) }, "no guard: not exactly once")
	}
	ref := draw.LineStyle{Color: color.Black, Width: 1, Dashes: []vg.Length{4, 2}}
	c.StrokeLine2(ref, x+sw/2, yc-sh/2-1, x+sw/2, yc+sh/2+1)
	x += sw + 4
	c.FillText(sty, vg.Point{X: x, Y: yc}, "1× = hand-rolled batched")
}
