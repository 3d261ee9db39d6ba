#!/usr/bin/python3
"""readme_section.py RESULTS_MD README — put the benchmark table between the
README's <!-- bench:begin --> and <!-- bench:end --> markers (make bench-readme)."""
import sys

results, readme = sys.argv[1], sys.argv[2]
table = open(results).read().strip()
text = open(readme).read()
begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
i, j = text.find(begin), text.find(end)
if i < 0 or j < i:
    sys.exit("readme_section.py: %s has no %s ... %s section" % (readme, begin, end))
text = text[:i + len(begin)] + "\n" + table + "\n" + text[j:]
open(readme, "w").write(text)
print("updated the performance section of %s from %s" % (readme, results))
