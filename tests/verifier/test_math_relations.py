"""Relations in math answers as a class (nodeagent/verifier/mathrel.py): every spelling of
equality states every side, and a relation the gold does not hold is never the gold's value.
The wrong answers are the s9 red team's (a sweep of relation commands, `==`, `:=`, unicode) and
each is accepted on the code before mathrel; the right ones must stay accepted."""
from __future__ import annotations

import pytest

from nodeagent.verifier.checkers import answer_verdict


def box(s: str) -> str:
    return f"The answer is \\boxed{{{s}}}."


EQUALITIES = ("\\equiv", "\\cong", "==", "=\\!=", ":=", "=:", "\\coloneqq", "\\Coloneqq", "\\eqqcolon", "\\colon=",
              "\\doteq", "\\Doteq", "\\circeq", "\\bumpeq", "\\triangleq", "\\stackrel{?}{=}", "\\overset{?}{=}",
              "\\overset{\\text{def}}{=}", "\\text{ equals }", "\\text{ is congruent to }", "≡", "≅", "≔", "≜", "⩵")
APPROXIMATIONS = ("\\approxeq", "\\thickapprox", "≈")
OTHERS = ("\\propto", "\\subset", "\\subseteq", "\\supset", "\\in", "\\notin", "\\ni", "\\ncong", "\\nsim",
          "\\nequiv", "\\gneq", "\\lneq", "\\leqslant", "\\geqslant", "\\succ", "\\prec", "\\preceq", "\\parallel",
          "\\perp", "\\asymp", "\\ll", "\\gg", "\\lesssim", "\\models", "\\vdash", "≠", "≤", "≥", "<", ">",
          "\\le", "\\ge", "\\neq", "\\ne", "∝", "⊂", "∈", "⪯", "⊊", "∣", "∤", "⊢", "≍", "∋", "≲", "\\Leftrightarrow", "\\iff",
          "≙", "≞", "≗", "⩮", "≑", "≒", "∽", "⇔")
WRONG = ([("5", box(f"6 {r} 5")) for r in EQUALITIES + APPROXIMATIONS + OTHERS]
         + [("5", box(f"x {r} 6, x = 5")) for r in EQUALITIES[:12] + ("\\propto", "\\asymp")]
         + [("5050", box("5051 \\equiv 5050")), ("5050", box("5051 == 5050")), ("5050", box("x \\cong 5051, x = 5050"))]
         + [("5\\text{ cm}", box("5\\text{ cm}^2")),
            ("5", box("5\\text{ score}")), ("5", box("5\\text{ gross}")), ("5", box("5\\text{‰}")),
            ("5", box("5 \\permil")), ("5", box("5\\text{ bps}")), ("5", box("\\tiny 6 \\normalsize 5"))])
RIGHT = [("5", box("x = 5")), ("5", box("x \\equiv 5")), ("5", box("x := 5")), ("5", box("x == 5")),
         ("5", box("5 \\equiv 5")), ("5", box("x ≡ 5")), ("5", box("x = 10/2 = 5")), ("(0, 5)", box("x \\in (0, 5)")),
         ("x > 3", box("x > 3")), ("x \\ge 2", box("x \\geq 2")), ("[0, 1)", box("x \\in [0, 1)")),
         ("\\frac{1}{3}", box("\\frac{1}{3} \\approx 0.333")), ("5\\text{ cm}^2", box("5\\text{ cm}^{2}")),
         ("5\\text{ cm}", box("5\\text{ cm}"))]


@pytest.mark.parametrize("gold,pred", WRONG, ids=[p for _, p in WRONG])
def test_a_relation_between_two_different_values_is_never_the_gold(gold, pred):
    assert answer_verdict("math", gold, pred)["ok"] is False


@pytest.mark.parametrize("gold,pred", RIGHT, ids=[p for _, p in RIGHT])
def test_a_relation_that_states_only_the_gold_is_still_the_gold(gold, pred):
    assert answer_verdict("math", gold, pred)["ok"] is True


# The relation tables of amssymb (the "Comprehensive LaTeX Symbol List", relations and negated
# relations), each in three forms: the red team's sweep found 87 of 134 accepted, this one 241 of 483
# on the code before mathrel.
SWEEP_RELS = r"""\leq \geq \equiv \models \prec \succ \sim \perp \preceq \succeq \simeq \mid \ll \gg \asymp \parallel \subset \supset
\approx \bowtie \subseteq \supseteq \cong \sqsubset \sqsupset \neq \smile \sqsubseteq \sqsupseteq \doteq \frown \in \ni \propto
\vdash \dashv \leqq \geqq \leqslant \geqslant \eqslantless \eqslantgtr \lesssim \gtrsim \lessapprox \gtrapprox \approxeq
\lessdot \gtrdot \lll \ggg \lessgtr \gtrless \lesseqgtr \gtreqless \lesseqqgtr \gtreqqless \doteqdot \eqcirc \risingdotseq
\circeq \fallingdotseq \triangleq \backsim \thicksim \backsimeq \thickapprox \subseteqq \supseteqq \Subset \Supset \sqsubset
\sqsupset \preccurlyeq \succcurlyeq \curlyeqprec \curlyeqsucc \precsim \succsim \precapprox \succapprox \vartriangleleft
\vartriangleright \trianglelefteq \trianglerighteq \vDash \Vdash \Vvdash \smallsmile \smallfrown \bumpeq \Bumpeq \shortmid
\shortparallel \between \pitchfork \varpropto \blacktriangleleft \blacktriangleright \therefore \because \nless \ngtr
\nleq \ngeq \nleqslant \ngeqslant \nleqq \ngeqq \lneq \gneq \lneqq \gneqq \lvertneqq \gvertneqq \lnsim \gnsim \lnapprox
\gnapprox \nprec \nsucc \npreceq \nsucceq \precneqq \succneqq \precnsim \succnsim \precnapprox \succnapprox \nsim \ncong
\nshortmid \nshortparallel \nmid \nparallel \nvdash \nvDash \nVdash \nVDash \ntriangleleft \ntriangleright \ntrianglelefteq
\ntrianglerighteq \nsubseteq \nsupseteq \nsubseteqq \nsupseteqq \subsetneq \supsetneq \varsubsetneq \varsupsetneq
\subsetneqq \supsetneqq \notin \ne \coloneqq \eqqcolon \Coloneqq \approxident \eqdef \neqq""".split()


def test_no_relation_command_of_the_amssymb_tables_states_the_gold_between_other_values():
    accepted = [p for r in SWEEP_RELS for p in (f"6 {r} 5", f"x {r} 6, x = 5", f"5 {r} 6 = 5")
                if answer_verdict("math", "5", box(p))["ok"]]
    assert accepted == []
