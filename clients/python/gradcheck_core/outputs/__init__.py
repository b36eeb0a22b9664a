"""Every output format the client and batch-merge write, each with its one escaping function.

Every string from a graph, a report or a record is hostile (a graph author names the nodes).
`text.clip` is the base of all of them: cut to a bound, one line, non-printable and invisible
characters (controls, bidi overrides, zero-width and line separators) as visible escapes. Each
format then escapes its own syntax in one function, used by every writer of that format:

    text.py      terminal text        clip / lines
    markdown.py  Markdown (GFM)       code           summary_markdown
    mermaid.py   Mermaid labels       label          neighbourhood_mermaid
    html.py      HTML (and its SVG)   h / script_json
    html_report.py  the --html page (drawn from graph_view.py)      build_html
    xml.py       XML (JUnit, SVG)     chars / escape
    junit.py     JUnit XML                           junit_xml
    outcome.py   what every writer reads: one Outcome per graph
    guard.py     an output that cannot be made: its fallback and a warning, never the exit code

Kept light: nothing is imported here, so the service's error path can use `text` alone.
"""
