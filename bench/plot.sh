#!/bin/sh
# plot.sh — draw coll-bench results: bus bandwidth against message size (log axis), one
# line per collective (per collective, type and op when the data holds several of them).
#
#   plot.sh DATA.csv OUT.svg|OUT.png [TITLE [BOUND_GBPS]]
#
# BOUND_GBPS, when given, is drawn as a dashed line: the transport's measured bandwidth
# (1/beta of coll-bench's alpha-beta probe), which busbw of a bandwidth-optimal
# algorithm approaches and cannot beat.
#
# DATA.csv is what `coll-bench --csv FILE` writes (coll-bench --plot runs this script on
# a CSV of its own).  The out-of-place bus bandwidth is plotted; rows of size 0 are left
# out (no place on a log axis).  Needs gnuplot (Debian: gnuplot-nox).
set -eu

if [ $# -lt 2 ]; then
  echo "usage: plot.sh DATA.csv OUT.svg|OUT.png [TITLE]" >&2
  exit 2
fi
csv=$1
out=$2
title=${3:-coll-bench}
bound=${4:-}

if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot.sh: gnuplot is not installed (Debian: apt-get install gnuplot-nox)" >&2
  exit 127
fi
if [ ! -r "$csv" ]; then
  echo "plot.sh: cannot read $csv" >&2
  exit 2
fi

case $out in
  *.svg) term='set terminal svg size 960,600 dynamic font "Helvetica,12" background rgb "white"' ;;
  *.png)
    if gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1; then
      term='set terminal pngcairo size 960,600 font "Sans,10" background rgb "white"'
    else
      term='set terminal png size 960,600'
    fi ;;
  *) echo "plot.sh: $out: the output must end in .svg or .png" >&2; exit 2 ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/coll-bench-plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# Columns: 1 collective, 2 nranks, 3 transport, 4 algorithm, 5 type, 6 redop, 8 size,
# 12 out-of-place busbw.  Each series goes to its own file, sorted by size.
awk -F, -v dir="$tmp" '
  NR == 1 { next }
  { rows[NR] = $0; types[$5] = 1; if ($6 != "none") ops[$6] = 1
    info = "nranks " $2 ", " $3 ", algorithm " $4 }
  END {
    nt = 0; for (t in types) nt++
    no = 0; for (o in ops) no++
    multi = nt > 1 || no > 1
    ns = 0
    for (i = 2; i <= NR; i++) {
      if (!(i in rows)) continue
      split(rows[i], f, ",")
      if (f[8] + 0 <= 0 || f[12] == "") continue
      label = f[1]
      if (multi) { label = label " " f[5]; if (f[6] != "none") label = label " " f[6] }
      if (!(label in id)) { id[label] = ++ns; print ns "\t" label > (dir "/series") }
      print f[8], f[12] > (dir "/s" id[label] ".dat")
    }
    print info > (dir "/info")
  }' "$csv"

if [ ! -s "$tmp/series" ]; then
  echo "plot.sh: $csv has no rows to plot" >&2
  exit 1
fi

info=$(cat "$tmp/info")
# gnuplot strings are double-quoted here: keep the text free of quotes and backslashes.
clean() { printf '%s' "$1" | tr -d '"\\'; }
plots=""
while IFS="	" read -r n label; do
  sort -n -k1,1 "$tmp/s$n.dat" > "$tmp/s$n.sorted"
  plots="$plots${plots:+, }\"$tmp/s$n.sorted\" using 1:2 with linespoints lw 2 pt 7 ps 0.6 title \"$(clean "$label")\""
done < "$tmp/series"
case $bound in
  ''|*[!0-9.]*) ;;
  *) plots="$plots, $bound with lines dt 2 lw 2 lc rgb \"#555555\" title \"link bound 1/beta = $bound GB/s (measured)\"" ;;
esac

cat > "$tmp/plot.gp" <<EOF
$term
set output "$(clean "$out")"
set title "$(clean "$title")\n$(clean "$info")" noenhanced
set key top left noenhanced
set logscale x 2
set format x "%.0b%B"
set xlabel "message size in bytes (nccl-tests convention; Ki = 1024)"
set ylabel "bus bandwidth (GB/s)"
set yrange [0:*]
set grid xtics ytics
plot $plots
EOF
gnuplot "$tmp/plot.gp"
