"""An output never decides a run: `written` builds one (HTML page, Markdown summary, JUnit file), and
when building it fails, writes its fallback instead and says so in one warning line on stderr; the
exit code stays the verification's. (Each writer bounds its own time and size: html_report.py,
graph_view.py, markdown.py, mermaid.py.)"""
from __future__ import annotations

import sys

from .text import clip


def written(what: str, build, fallback, instead: str) -> str:
    """build() -> the output's text; on any failure, fallback() (`instead` says what that is)."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 -- any fault of a writer: the fallback, never the run's outcome
        print(f"gradcheck: warning: {what} could not be made ({type(exc).__name__}: {clip(exc, 200)}); "
              f"wrote {instead}", file=sys.stderr)
        return fallback()


def html_text(items: list, integrity: str, title: str = "gradcheck report") -> str:
    """The --html page (both CLIs), or its index alone if the page cannot be made."""
    from .html_report import build_html, index_page

    return written("the HTML page", lambda: build_html(items, title=title, integrity=integrity),
                   lambda: index_page(items, title=title), "a page of the verdicts only")


def junit_text(outcomes: list) -> str:
    from .junit import junit_xml

    return written("the JUnit file", lambda: junit_xml(outcomes), lambda: junit_xml(outcomes, reports=False),
                   "one without the reports' text")


def markdown_text(outcomes: list) -> str:
    from .markdown import summary_markdown

    return written("the Markdown summary", lambda: summary_markdown(outcomes),
                   lambda: summary_markdown(outcomes, diagrams=False), "one without diagrams")


def wanted(junit=None, summary_md=None, html=None) -> bool:
    """Whether write_reports would write anything: a caller skips building its Outcomes when not."""
    import os

    return bool(junit or summary_md or html or os.environ.get("GITHUB_STEP_SUMMARY"))


def write_reports(outcomes: list, save, *, junit=None, summary_md=None, html=None, html_items=None,
                  integrity: str = "check", title: str = "gradcheck report") -> None:
    """The CI files of both `verify` commands, from the same Outcomes: --junit, --html (html_items(): the
    page's RunItems), --summary-md and $GITHUB_STEP_SUMMARY (appended). save(path, text, flag) writes one
    file, raising the command's own one-line error when it cannot."""
    import os

    if junit:
        save(junit, junit_text(outcomes), "--junit")
    if html:
        save(html, html_text(html_items(), integrity, title=title), "--html")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_md and not step_summary:
        return
    md = markdown_text(outcomes)
    if summary_md:
        save(summary_md, md, "--summary-md")
    if step_summary:  # the environment's file, not a flag: one it cannot append to is a warning, never the
        try:  # run's outcome (it was a traceback, exit 1 after a pass; an internal error from gradcheck-svc)
            with open(step_summary, "a") as fh:
                fh.write(md)
        except OSError as exc:
            print(f"gradcheck: warning: $GITHUB_STEP_SUMMARY '{clip(step_summary, 200)}': cannot append the "
                  f"summary: {exc.strerror or exc}", file=sys.stderr)
