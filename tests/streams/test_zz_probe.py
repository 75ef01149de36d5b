from activedb import streams


def attempt(label, fn):
    try:
        r = fn()
        print(label, "OK", r)
    except BaseException as error:
        print(label, "RAISED", type(error).__mro__[:2], str(error).replace("\n", " | "))


def test_probe(db):
    e = streams.StreamEngine(db, name="lang", durable=False)
    e.create_stream("s", types=["A", "B"], attributes=("k", "x"))
    for text in ["", "   ", "CREATE QUERY Q PATTERN SEQ(A, B) WITHIN 0 sec RETURN A.x",
                 "CREATE QUERY Q1 PATTERN SEQ(A, B) WITHIN -5 sec RETURN A.x",
                 "CREATE QUERY Q2 PATTERN SEQ(A, B) WHERE A.x = 'abc RETURN A.x",
                 "CREATE QUERY Q3 PATTERN SEQ(A, B) RETURN A.x, A.x",
                 "CREATE QUERY Q4 PATTERN SEQ(A, B) RETURN A.x AS y, B.x AS y",
                 "CREATE QUERY Q5 PATTERN SEQ(A, A) RETURN A.x",
                 "CREATE QUERY Q6 PATTERN SEQ(!A, B) RETURN B.x",
                 "CREATE QUERY Q7 PATTERN SEQ(A, !B) RETURN A.x",
                 "CREATE QUERY Q8 PATTERN SEQ(A, B) WITHIN 1e400 sec RETURN A.x",
                 "CREATE QUERY Q9 PATTERN SEQ(A, B) PRIORITY 1e400 RETURN A.x",
                 "CREATE QUERY Q10 PATTERN SEQ(A, B) WITHIN 10 fortnights RETURN A.x",
                 "CREATE QUERY Q11 PATTERN SEQ(A, B) RETURN A.x; CREATE QUERY Q11 PATTERN SEQ(A, B) RETURN A.x",
                 "CREATE QUERY Q12 PATTERN SEQ(A, B) WHERE A.x = 1 WHERE B.x = 2 RETURN A.x",
                 "CREATE QUERY Q13 PATTERN SEQ(A a1, B a1) RETURN a1.x",
                 "CREATE QUERY Q14 PATTERN A RETURN A.x",
                 "CREATE QUERY Q15 PATTERN SEQ(A, B) WHERE [nokey] RETURN A.x",
                 "CREATE QUERY Q16 PATTERN SEQ(A, B) WITHIN nan sec RETURN A.x",
                 "CREATE QUERY Q17 ON nostream PATTERN SEQ(A, B) RETURN A.x",
                 "CREATE QUERY Q18 PATTERN SEQ(A, B) RETURN A.x AS x PRIORITY -1",
                 "CREATE QUERY Q19 PATTERN SEQ() RETURN A.x",
                 "CREATE QUERY Q20 PATTERN SEQ(A, B) WHERE A.x = 5 -- comment\n RETURN A.x",
                 ]:
        attempt(repr(text[:60]), lambda: e.define(text))
    attempt("query within -1", lambda: e.query("P1", pattern=streams.seq("A", "B"), returns=[streams.event("A")["x"]], within=-1))
    attempt("query within nan", lambda: e.query("P2", pattern=streams.seq("A", "B"), returns=[streams.event("A")["x"]], within=float("nan")))
    attempt("query within str", lambda: e.query("P3", pattern=streams.seq("A", "B"), returns=[streams.event("A")["x"]], within="10"))
    attempt("query selection bad", lambda: e.query("P4", pattern=streams.seq("A", "B"), returns=[streams.event("A")["x"]], selection="bogus"))
    attempt("query priority str", lambda: e.query("P5", pattern=streams.seq("A", "B"), returns=[streams.event("A")["x"]], priority="high"))
    attempt("rule unknown query", lambda: e.rule("R1", on_output="NOPE", action=lambda tx, new: None))
    attempt("rule action not callable", lambda: e.rule("R2", on_output="Q", action=5))
