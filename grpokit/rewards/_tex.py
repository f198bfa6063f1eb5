"""The TeX a reader sees printed: an allowlist, for `math_accuracy` (see `_answers.visible_region`).

A completion is graded from what a reader of it rendered sees. TeX can store text without printing it
(box registers: \\setbox0=\\hbox{18}, \\sbox), skip it (conditionals: \\iffalse, \\ifnum1=0, \\else;
comment environments), print it elsewhere or never (user-defined macros and environments) or restyle it
(\\color{white}, \\rlap, \\smash). Rather than name every such construct, the graded text may hold only
TeX that prints what it holds, here: `PRINTING_COMMANDS` (symbols, operators, fonts and structure whose
arguments are printed as written), `PRINTING_ENVIRONMENTS` and the one-character commands of
`PRINTING_SYMBOLS`. Any other command or environment, \\begin{comment}, \\begin{secret} and \\newenvironment
included, makes the completion ungradable (`first_unprinted` names it; the completion scores 0). Commands
that print nothing and take no text (\\quad, \\displaystyle, \\left) are on the list: nothing can hide in
them. \\label and \\phantom, which take text and print nothing, are removed with their argument before this
check (`_answers.py`), so an answer inside them is simply not seen.
"""

from __future__ import annotations

import re

_GREEK = """alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa varkappa lambda mu nu xi
omicron pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega digamma Gamma Delta Theta Lambda
Xi Pi Sigma Upsilon Phi Psi Omega Alpha Beta Epsilon Zeta Eta Iota Kappa Mu Nu Omicron Rho Tau Chi varGamma
varDelta varTheta varLambda varXi varPi varSigma varUpsilon varPhi varPsi varOmega"""
_OPERATORS = """pm mp times div cdot ast star circ bullet oplus ominus otimes oslash odot cap cup sqcap sqcup vee wedge
setminus smallsetminus wr dagger ddagger amalg land lor lnot neg uplus barwedge veebar boxplus boxminus boxtimes
boxdot divideontimes ltimes rtimes leftthreetimes rightthreetimes curlyvee curlywedge intercal dotplus centerdot
cdotp ldotp"""
_RELATIONS = """le leq ge geq ne neq equiv approx approxeq sim simeq cong propto ll gg lll ggg subset supset subseteq
supseteq subsetneq supsetneq nsubseteq nsupseteq sqsubset sqsupset sqsubseteq sqsupseteq in ni notin owns mid nmid
parallel nparallel perp models vdash dashv prec succ preceq succeq asymp doteq leqslant geqslant lesssim gtrsim
lessapprox gtrapprox nless ngtr nleq ngeq lneq gneq lneqq gneqq leqq geqq neg bowtie smile frown thicksim
thickapprox backsim eqsim triangleq coloneqq eqqcolon divides"""
_ARROWS = """to gets rightarrow leftarrow Rightarrow Leftarrow leftrightarrow Leftrightarrow implies impliedby iff
mapsto longmapsto longrightarrow longleftarrow Longrightarrow Longleftarrow longleftrightarrow
Longleftrightarrow uparrow downarrow updownarrow Uparrow Downarrow Updownarrow nearrow searrow swarrow nwarrow
hookrightarrow hookleftarrow rightharpoonup rightharpoondown leftharpoonup leftharpoondown rightleftharpoons
leadsto twoheadrightarrow rightsquigarrow circlearrowleft circlearrowright curvearrowleft curvearrowright
xrightarrow xleftarrow xRightarrow xLeftarrow"""
_MISC = """infty partial nabla forall exists nexists emptyset varnothing angle measuredangle sphericalangle triangle
vartriangle square Box blacksquare qed checkmark degree prime backprime ell hbar hslash Re Im aleph beth gimel wp
top bot therefore because ldots cdots vdots ddots dots dotsc dotsb dotsm dotsi dotso colon lfloor rfloor lceil
rceil langle rangle lvert rvert lVert rVert vert Vert backslash surd flat sharp natural clubsuit diamondsuit
heartsuit spadesuit diamond lozenge blacklozenge bigstar triangledown blacktriangle mho complement eth imath
jmath Finv Game varkappa textdegree textbackslash dag ddag S P copyright pounds euro textdollar dollar textperthousand
textpm texttimes textdiv textasciitilde textasciicircum textbar textless textgreater textendash textemdash
textbullet ldquo rdquo lq rq"""
_FUNCTIONS = """sum prod coprod int iint iiint oint bigcup bigcap bigsqcup bigoplus bigotimes bigodot biguplus bigvee
bigwedge lim limsup liminf sup inf max min arg det dim deg gcd hom ker log lg ln exp sin cos tan cot sec csc
arcsin arccos arctan arccot arcsec arccsc sinh cosh tanh coth sech csch Pr injlim projlim varliminf varlimsup
varinjlim varprojlim"""
_LAYOUT = """quad qquad enspace thinspace medspace thickspace negthinspace negmedspace negthickspace space nobreakspace
big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr Biggl Biggr bigm Bigm biggm Biggm left right middle
displaystyle textstyle scriptstyle scriptscriptstyle limits nolimits not newline par noindent indent centering
hline cline toprule midrule bottomrule item nonumber notag allowbreak nobreak linebreak smallskip medskip bigskip
hfill vfill relax"""
_PRINTS_ITS_ARGUMENTS = """frac dfrac tfrac cfrac sqrt boxed fbox framebox mbox hbox text textbf textit textsl textrm
textsf texttt textup textnormal textmd emph underline overline mathrm mathbf mathit mathsf mathtt mathbb
mathcal mathfrak mathscr mathnormal boldsymbol bm pmb operatorname hat bar vec tilde dot ddot dddot acute grave
breve check mathring widehat widetilde overrightarrow overleftarrow overleftrightarrow overbrace underbrace
overset underset stackrel binom dbinom tbinom substack pmod bmod mod pod tag ensuremath textsuperscript
textsubscript section subsection subsubsection paragraph subparagraph textcircled"""
PRINTING_COMMANDS = frozenset(
    " ".join(
        (_GREEK, _OPERATORS, _RELATIONS, _ARROWS, _MISC, _FUNCTIONS, _LAYOUT, _PRINTS_ITS_ARGUMENTS)
    ).split()
)
"""Commands whose output a reader sees as written: symbols, operators, relations, arrows, function names,
spacing and sizes (which take no text), and fonts and structure whose arguments are printed."""
PRINTING_ENVIRONMENTS = frozenset(
    """equation equation* align align* aligned alignat alignat* alignedat gather gather* gathered multline
    multline* split flalign flalign* cases cases* dcases rcases array matrix pmatrix bmatrix Bmatrix vmatrix
    Vmatrix smallmatrix subarray tabular tabular* itemize enumerate description center flushleft flushright quote
    quotation verse math displaymath eqnarray eqnarray* proof""".split()
)
"""Environments that print their content as written (not user-defined ones, whose meaning is unknown)."""
PRINTING_SYMBOLS = frozenset("\\,;:! %$&#_{}|[]()<>'\"^~`.=-")
"""One-character commands: \\\\ (a line break), spacing (\\, \\; \\! \\ ), escaped characters (\\% \\$ \\{),
math delimiters \\( \\) \\[ \\] and accents (\\' \\" \\^ ...)."""
_COMMAND_RE = re.compile(r"\\(?:([A-Za-z]+)\*?|(.))", re.DOTALL)
_ENVIRONMENT_RE = re.compile(r"\s*\{([^{}]*)\}")


def first_unprinted(text: str) -> str | None:
    """The first command or environment of `text` not known to print what it holds ("\\setbox",
    "\\begin{comment}"), None when everything it holds prints."""
    if "\\" not in text:
        return None
    for m in _COMMAND_RE.finditer(text):
        name, symbol = m.group(1), m.group(2)
        if symbol is not None:
            if symbol not in PRINTING_SYMBOLS:
                return "\\" + symbol
            continue
        if name in ("begin", "end"):
            env = _ENVIRONMENT_RE.match(text, m.end())
            if env is None or env.group(1).strip() not in PRINTING_ENVIRONMENTS:
                return f"\\{name}{{{env.group(1) if env else ''}}}"
            continue
        if name not in PRINTING_COMMANDS:
            return "\\" + name
    return None
