/*
 * plot.c — the loss curve as a self-contained SVG (no gnuplot needed): training loss per
 * step as a thin line, validation loss as dots joined by a thicker line, axes with
 * ticks. Written atomically like every other file libtrain produces.
 */
#include "base/util.h"

#include <math.h>

static double nice_step(double range) {
  double raw = range / 5.0, p = pow(10.0, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

int train_plot_svg(const char *path, long first_step, const float *loss, long n,
                   const long *val_steps, const float *val, long nval, const char *title,
                   char *err) {
  const double W = 800, H = 480, L = 70, R = 20, T = 40, Bm = 50;
  double ymin = INFINITY, ymax = -INFINITY;
  for (long i = 0; i < n; i++)
    if (isfinite(loss[i])) {
      ymin = fmin(ymin, loss[i]);
      ymax = fmax(ymax, loss[i]);
    }
  for (long i = 0; i < nval; i++)
    if (isfinite(val[i])) {
      ymin = fmin(ymin, val[i]);
      ymax = fmax(ymax, val[i]);
    }
  if (!(ymin <= ymax)) {
    ymin = 0;
    ymax = 1;
  }
  if (ymax - ymin < 1e-6) ymax = ymin + 1;
  double ys = nice_step(ymax - ymin);
  ymin = floor(ymin / ys) * ys;
  ymax = ceil(ymax / ys) * ys;
  double xmin = (double)first_step, xmax = (double)first_step + (n > 1 ? n - 1 : 1);
  for (long i = 0; i < nval; i++) {
    xmin = fmin(xmin, (double)val_steps[i]);
    xmax = fmax(xmax, (double)val_steps[i]);
  }
  if (xmax <= xmin) xmax = xmin + 1;
  double xs = nice_step(xmax - xmin);
#define PX(step) (L + ((step)-xmin) / (xmax - xmin) * (W - L - R))
#define PY(v) (T + (ymax - (v)) / (ymax - ymin) * (H - T - Bm))

  train_atomic a;
  if (train_atomic_open(&a, path, err) != 0) return -1;
  FILE *f = a.f;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "font-family=\"sans-serif\" font-size=\"12\">\n",
          W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
  for (const char *c = title ? title : "loss"; *c; c++) /* escape for XML */
    if (*c == '<')
      fputs("&lt;", f);
    else if (*c == '&')
      fputs("&amp;", f);
    else
      fputc(*c, f);
  fprintf(f, "</text>\n");
  for (double y = ymin; y <= ymax + ys * 0.01; y += ys) {
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L,
            W - R, PY(y), PY(y));
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 6, PY(y) + 4, y);
  }
  for (double x = ceil(xmin / xs) * xs; x <= xmax; x += xs)
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(x), H - Bm + 18,
            x);
  fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2,
          H - 10);
  fprintf(f,
          "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
          "text-anchor=\"middle\">loss</text>\n",
          (T + H - Bm) / 2, (T + H - Bm) / 2);
  fprintf(f,
          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
          "stroke=\"black\"/>\n",
          L, T, W - L - R, H - T - Bm);
  fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1\" points=\"");
  for (long i = 0; i < n; i++)
    if (isfinite(loss[i])) fprintf(f, "%.1f,%.1f ", PX((double)(first_step + i)), PY(loss[i]));
  fprintf(f, "\"/>\n");
  if (nval > 0) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
    for (long i = 0; i < nval; i++) fprintf(f, "%.1f,%.1f ", PX((double)val_steps[i]), PY(val[i]));
    fprintf(f, "\"/>\n");
    for (long i = 0; i < nval; i++)
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n",
              PX((double)val_steps[i]), PY(val[i]));
  }
  fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train loss</text>\n", W - R - 150,
          T + 18);
  if (nval > 0)
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">validation loss</text>\n", W - R - 150,
            T + 34);
  fprintf(f, "</svg>\n");
  return train_atomic_commit(&a, err);
#undef PX
#undef PY
}
