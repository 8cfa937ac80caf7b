//go:build e2e

package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// drawChart draws p50 latency by operation, ours against the floor, as
// horizontal bar pairs with their values.
func drawChart(path string, rows []Row) error {
	const (
		width, rowH, left, barH = 900, 44, 230, 14
		top                     = 50
	)
	height := top + rowH*len(rows) + 40
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), &image.Uniform{color.White}, image.Point{}, draw.Src)
	ours, floorC, ink := color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xaa, 0xaa, 0xaa, 0xff}, color.Black
	max := 0.0
	for _, r := range rows {
		if r.OursP50 > max {
			max = r.OursP50
		}
		if r.FloorP50 > max {
			max = r.FloorP50
		}
	}
	if max == 0 {
		max = 1
	}
	scale := float64(width-left-120) / max
	text := func(x, y int, s string) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(ink), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	bar := func(y int, ms float64, c color.Color) {
		w := int(ms * scale)
		if w < 1 {
			w = 1
		}
		draw.Draw(img, image.Rect(left, y, left+w, y+barH), &image.Uniform{c}, image.Point{}, draw.Src)
		text(left+w+6, y+11, fmt.Sprintf("%.2f ms", ms))
	}
	text(10, 20, "p50 latency by operation: ours (blue) vs client-go floor (grey)")
	for i, r := range rows {
		y := top + i*rowH
		text(10, y+18, fmt.Sprintf("%s c=%d", r.Operation, r.Concurrency))
		bar(y, r.OursP50, ours)
		bar(y+barH+2, r.FloorP50, floorC)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}
