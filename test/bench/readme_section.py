#!/usr/bin/python3
"""readme_section.py RESULTS_MD README — put the benchmark table between the
README's <!-- bench:begin --> and <!-- bench:end --> markers, and the plot
next to the results (plot.png) into docs/bench-plot.png (make bench-readme)."""
import os
import shutil
import sys

results, readme = sys.argv[1], sys.argv[2]
table = open(results).read().strip()
plot = os.path.join(os.path.dirname(results), "plot.png")
if os.path.exists(plot):
    dest = os.path.join(os.path.dirname(readme) or ".", "docs", "bench-plot.png")
    shutil.copyfile(plot, dest)
    table += "\n\n![drain rate by scenario and by workers x batch_size](docs/bench-plot.png)"
text = open(readme).read()
begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
i, j = text.find(begin), text.find(end)
if i < 0 or j < i:
    sys.exit("readme_section.py: %s has no %s ... %s section" % (readme, begin, end))
text = text[:i + len(begin)] + "\n" + table + "\n" + text[j:]
open(readme, "w").write(text)
print("updated the performance section of %s from %s" % (readme, results))
