"""The formula parser's tokenizer: what counts as a number."""
import pytest

from gradcheck_svc.errors import GraphError
from gradcheck_svc.ops.formula import parse_formula, symbols_for


def test_ascii_digits_are_numbers():
    table = symbols_for(["x"])
    assert parse_formula("x*3 + 0.5e1", table, "n") == 3 * table["x"] + 5


# three as Arabic-Indic, full-width, Bengali and mathematical bold digits
@pytest.mark.parametrize("digit", ["\u0663", "\uff13", "\u09e9", "\U0001d7db"])
def test_non_ascii_digits_are_refused_naming_the_character(digit):
    with pytest.raises(GraphError) as exc:
        parse_formula(f"x*{digit}", symbols_for(["x"]), "n")
    assert exc.value.message == f"node 'n': attribute 'formula' has an unexpected character at column 3: '{digit}'"


def test_non_ascii_digit_inside_a_literal_is_refused():
    with pytest.raises(GraphError, match="column 2"):
        parse_formula("1\u0663", symbols_for(["x"]), "n")
