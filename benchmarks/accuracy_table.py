"""The table printer the accuracy benchmarks share (model_accuracy.py and llama_accuracy.py both import it,
so neither imports the other to print)."""


def table(title, header, rows):
    print(f"\n## {title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))
