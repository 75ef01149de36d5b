"""The Prometheus endpoint (``activedb/metrics``) on real PostgreSQL: a scrape over HTTP returns the rule
firings per rule and outcome, lock waits and deadlocks, dead letters per reason, the outbox and capture
numbers, read at scrape time from the public statistics; a failing source is reported, not fatal."""

from __future__ import annotations

import threading
import types
import urllib.request

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

import activedb
from activedb.metrics import BatchLatency, MetricsError, MetricsExporter, parse_listen, reason_label
from activedb.deadletters import ReasonKind
from activedb.testing import Watchdog, wait_until
from tests.conftest import APP_MIGRATIONS

TIMEOUT = 60


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a scrape."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def deadlock(database) -> int:
    """Two transactions that each hold a row the other wants: one is the victim.  Returns the victims."""
    caught: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def one(mine: str, theirs: str, closes: bool) -> None:
        try:
            with database.transaction() as tx:
                tx.write("items", mine, value=1)
                barrier.wait()
                if closes:
                    wait_until(lambda: database.transactions.locks.statistics().waiting == 1, TIMEOUT,
                               "the other transaction never waited")
                tx.write("items", theirs, value=1)
        except activedb.DeadlockDetected as error:
            caught.append(error)

    with Watchdog(TIMEOUT, database.transactions.locks):
        threads = [threading.Thread(target=one, args=("a", "b", False)),
                   threading.Thread(target=one, args=("b", "a", True))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    return len(caught)


@pytest.fixture
def database(database_url):
    database = activedb.connect(database_url)
    database.upgrade_app(APP_MIGRATIONS)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, events_seen, activedb_dead_letters, activedb_outbox "
                                   "RESTART IDENTITY"))
    yield database
    database.close()


def test_a_scrape_returns_rules_locks_dead_letters_outbox_and_capture(database):
    @database.rule(on=database.signalled("go"), name="positive")
    def positive(tx, event):
        if event.payload["n"] < 0:
            raise ValueError("negative")
        tx.insert("events_seen", rule="positive", detail=str(event.payload["n"]))

    @database.rule(on=database.signalled("go"), coupling=activedb.Coupling.DETACHED, name="later")
    def later(tx, event):
        tx.insert("events_seen", rule="later", detail=str(event.payload["n"]))

    with database.transaction() as tx:
        for number in (1, 2, -1):
            try:
                with tx.subtransaction() as child:
                    child.signal("go", n=number)
            except activedb.RuleFailed:
                pass
    database.rules.wait_idle(TIMEOUT)                # the detached firings ran (through the outbox)
    assert deadlock(database) == 1
    with database.engine.begin() as connection:
        connection.execute(sa.text(
            "INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES "
            "('q@1', 0, 'late: ts 2024-05-01 is older than the watermark', '{}'), "
            "('q@1', 0, 'late: ts 2024-05-02 is older than the watermark', '{}'), "
            "('q@1', 1, 'rejected by rule ''positive'': negative', '{}')"))

    with MetricsExporter(database) as exporter:
        url = exporter.start("127.0.0.1:0")
        assert url == f"http://127.0.0.1:{exporter.port}/metrics" and exporter.port > 0
        values = samples(scrape(url))

    assert values[("activedb_rule_firings_total", (("outcome", "fired"), ("rule", "positive")))] == 3
    assert values[("activedb_rule_firings_total", (("outcome", "executed"), ("rule", "positive")))] == 2
    assert values[("activedb_rule_firings_total", (("outcome", "failed"), ("rule", "positive")))] == 1
    assert values[("activedb_lock_waits_total", ())] >= 1
    assert values[("activedb_deadlocks_total", ())] == 1
    # The deadlock's victim; the failed inline children are frames (their rule's too), not lock-manager transactions.
    assert values[("activedb_transactions_total", (("event", "aborted"),))] >= 1
    assert values[("activedb_dead_letters", (("reason", "late"),))] == 2
    assert values[("activedb_dead_letters", (("reason", "rejected by rule"),))] == 1
    assert values[("activedb_outbox_firings", (("status", "done"),))] == 3     # detached: also the aborted trigger
    assert values[("activedb_outbox_firings", (("status", "failed"),))] == 0
    assert ("activedb_outbox_firings", (("status", "pending"),)) in values
    assert all(values[("activedb_metrics_source_up", (("source", source),))] == 1
               for source in ("rules", "locks", "outbox", "capture", "dead_letters", "ingestion"))


def test_capture_backlog_is_exported_per_table(database):
    database.capture("items")
    try:
        with database.engine.begin() as connection:          # another program's writes
            connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('x', 1), ('y', 1), ('z', 1)"))
        values = samples(MetricsExporter(database).scrape())
        assert values[("activedb_capture_backlog_changes", (("consumer", ""), ("table", "items")))] == 3
    finally:
        database.capture.remove("items", discard_pending=True)


def test_a_source_that_fails_is_reported_and_the_others_still_export(database):
    class Broken:
        def statistics(self):
            raise RuntimeError("the source is gone")

    exporter = MetricsExporter(database)
    exporter.watch_consumer(Broken())
    values = samples(exporter.scrape())
    assert values[("activedb_metrics_source_up", (("source", "capture_consumers"),))] == 0
    assert values[("activedb_metrics_source_up", (("source", "rules"),))] == 1


def test_the_histogram_counts_each_batch_once_across_scrapes():
    class Outcome:
        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

    histogram = BatchLatency(buckets=(0.1, 1.0))
    recent = [Outcome(0.05), Outcome(0.5)]
    assert histogram.absorb(recent) == 2
    assert histogram.absorb(recent) == 0              # nothing new
    recent = recent[1:] + [Outcome(3.0)]              # the source dropped its oldest
    assert histogram.absorb(recent) == 1
    assert histogram.snapshot() == ([("0.1", 1), ("1.0", 2), ("+Inf", 3)], pytest.approx(3.55))


@pytest.mark.parametrize("buckets", [(0.1, 0.1, 1.0), (1.0, float("nan")), (0.5, float("inf")), ("0.1",), (True,),
                                     "0.5", (1, 10**400)])
def test_histogram_bounds_that_give_no_valid_exposition_are_refused(buckets):
    """Duplicate bounds exported two buckets labelled le="0.1" (an exposition Prometheus refuses), inf a second
    le="+Inf", NaN a bucket no batch falls in; a text, or a bound that is no number, failed every scrape.  An int no
    float holds (10**400) raised a bare OverflowError, no MetricsError."""
    with pytest.raises(MetricsError, match=r"BatchLatency\(buckets=.*\) takes distinct finite numbers of seconds"):
        BatchLatency(buckets=buckets)


def test_a_batch_whose_seconds_are_no_duration_is_left_out_and_counted():
    """A NaN duration was counted in the first bucket and made the sum NaN for good (every later scrape exported
    activedb_batch_seconds_sum NaN); a negative one lowered the sum, which Prometheus reads as a counter reset; an
    infinite one made the sum +Inf for good; one that is no number failed every later scrape of the ingestion."""
    class Outcome:
        def __init__(self, seconds: object) -> None:
            self.seconds = seconds

    histogram = BatchLatency(buckets=(0.1, 1.0))
    recent = [Outcome(0.05), Outcome(float("nan")), Outcome(-2.0), Outcome(float("inf")), Outcome("slow"),
              Outcome(None), Outcome(0.5)]
    assert histogram.absorb(recent) == 2
    assert histogram.skipped == 5
    assert histogram.absorb(recent) == 0 and histogram.skipped == 5     # each outcome read once
    assert histogram.snapshot() == ([("0.1", 1), ("1.0", 2), ("+Inf", 2)], pytest.approx(0.55))


def test_listen_forms_and_their_errors():
    assert parse_listen("9464") == ("127.0.0.1", 9464)
    assert parse_listen(0) == ("127.0.0.1", 0)
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen("[::]:0") == ("::", 0)
    for bad in ("", "port", "70000", "host:-1"):
        with pytest.raises(MetricsError, match="give a port"):
            parse_listen(bad)
    # An IPv6 address without a port, or brackets around more than the address, was read as host ':' port 1 and
    # host '::1]x': the error then blamed the port ('cannot serve metrics on ::1 … choose another --metrics-port').
    # "::1:9464" without brackets is itself an IPv6 address: it was taken as ::1 port 9464, a guess.
    for bad in ("::1", "[::1]", "[::1]x:9464", "[::1:9464", "::1:9464", "fe80::1:8080"):
        with pytest.raises(MetricsError, match=r"give a port .* an IPv6 address in brackets, \[::1\]:9464"):
            parse_listen(bad)
    # A port is decimal digits: int() also took "1_000" (port 1000), "+9464", " 9464" inside an address and other
    # scripts' digits ("٩٤٦٤"), none of them PORT or ADDRESS:PORT, which the command line then served on.
    for bad in ("1_000", "+9464", "0.0.0.0:+80", "٩٤٦٤", "127.0.0.1:1_0"):
        with pytest.raises(MetricsError, match="give a port"):
            parse_listen(bad)
    assert reason_label("late: ts 1 is older") == "late"
    assert reason_label("") == "other"


def test_a_port_in_use_says_what_to_do(database):
    with MetricsExporter(database) as first:
        first.start("127.0.0.1:0")
        with pytest.raises(MetricsError, match="choose another --metrics-port"):
            MetricsExporter(database).start(f"127.0.0.1:{first.port}")


def test_a_second_ingestion_of_one_query_name_is_refused(database):
    """Two watched ingestions of one query name exported two samples with one label set in each ``activedb_ingest_*``
    family and ``activedb_batch_seconds`` — duplicate samples, which the exposition format forbids (Prometheus keeps
    one of them, whichever, and rejects the rest), so neither ingestion's numbers could be read.  The second is refused where it is watched (a MetricsError saying to give each its own source name); another
    name is taken."""
    from activedb.ingest import Ingestion

    exporter = MetricsExporter(database)
    first, twin, other = (Ingestion(database, source=name) for name in ("orders", "orders", "refunds"))
    try:
        exporter.watch_ingestion(first)
        with pytest.raises(MetricsError, match=r"query 'orders' is watched already.*its own source name"):
            exporter.watch_ingestion(twin)
        with pytest.raises(MetricsError, match=r"query 'orders' is watched already"):
            exporter.watch_ingestion(first)
        exporter.watch_ingestion(other)
        values = samples(exporter.scrape())
        assert {labels for name, labels in values if name == "activedb_ingest_batches_total"} == {
            (("query", "orders"),), (("query", "refunds"),)}
        assert sum(name == "activedb_batch_seconds_count" for name, _ in values) == 2
    finally:
        for ingestion in (first, twin, other):
            ingestion.close()


def test_dead_letters_are_labelled_by_the_kind_of_their_reason(database):
    """``activedb_dead_letters{reason=…}`` is labelled by the reason's kind (``activedb.deadletters.ReasonKind``), a
    closed set: it took the reason's text before its first colon, and a validation reason ("timestamp ('ts') is
    'x' (str) …") or a capture reason (naming its change and transaction ids) has no colon early, so each letter made
    a label value of its own — label variety without bound, which monitoring systems cannot keep."""
    change = "captured insert on 'orders' (change {n} of transaction {n}, commit position {n})"
    reasons = ([f"timestamp ('ts') is 'x{n}' (str), need a datetime" for n in range(3)]
               + [f"rule 'audit' failed on {change.format(n=n)}: ZeroDivisionError()" for n in range(3)]
               + [f"the reactions to {change.format(n=7)} cannot be committed: value too long",
                  "late: ts 2024-05-01 is older than the watermark", "rejected by rule 'positive': negative",
                  "aborted: rejected by rule 'positive': negative", "something else entirely"])
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) "
                                   "VALUES ('q@1', 0, :reason, '{}')"), [{"reason": reason} for reason in reasons])
    with MetricsExporter(database) as exporter:
        values = samples(exporter.scrape())
    letters = {dict(labels)["reason"]: value for (name, labels), value in values.items() if name == "activedb_dead_letters"}
    assert letters == {kind.value: 0 for kind in ReasonKind} | {"invalid row": 3, "rule failed": 3,
                                                               "refused by PostgreSQL": 1, "late": 1,
                                                               "rejected by rule": 2, "other": 1}


def test_stream_rejections_have_their_kind_and_every_kind_is_exported_at_zero_too(database):
    """A streams engine's ``rejected: …`` reasons (no type, unknown stream, a bad timestamp) were ``other``, and its
    tie_key raising was too; and a kind with no letter had no sample, where Prometheus' convention (and
    ``activedb_outbox_firings``) is a sample of 0, so that a rate or an alert on it sees the series from the start."""
    reasons = ["rejected: no stream 'x' in engine e (streams: s)",
               "rejected: the event has no type (type None); give each event a type, the name of one of s's types",
               "rejected: the tie_key of stream s raised ValueError('bad') for A^1"]
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) "
                                   "VALUES ('streams@1', 0, :reason, '{}')"), [{"reason": reason} for reason in reasons])
    with MetricsExporter(database) as exporter:
        values = samples(exporter.scrape())
    letters = {dict(labels)["reason"]: value for (name, labels), value in values.items() if name == "activedb_dead_letters"}
    assert letters == {kind.value: 0 for kind in ReasonKind} | {"invalid row": 2, "rule failed": 1}


# A reason of each kind, as its writers make them — with a lowered batch's ``aborted:`` prefix, a newline inside a
# name, and reasons that look alike but are not of the kind.
_REASONS_OF_EACH_KIND = [
    "timestamp ('ts') is 'x' (str), need a datetime", "malformed JSON: Expecting value at line 1 in '{'",
    "event type ('type') is 'zap\nzip', not a known event type (known: add)",
    "column 'value' is not valid UTF-8: the bytes FF at byte 0", "rejected: no stream 'x' in engine e (streams: s)",
    "captured insert on 'orders' (change 4 of transaction 9, commit position 3) cannot be delivered: gone",
    "late: ts 2024-05-01 is older than the watermark", "aborted: late: ts 1", "not late: ts 1",
    "duplicate: event id 'e1' was already ingested in batch 0 of q@r", "Duplicate: capital",
    "rejected by rule 'positive': negative", "aborted: rejected by rule 'positive': negative",
    "event processing failed: ZeroDivisionError: division by zero", "rule cascade limit: 100",
    "rule 'au\ndit' failed on captured insert on 'orders': E()", "s-transaction of 'r' aborted: E()",
    "rejected: the tie_key of stream s raised ValueError('bad') for A^1",
    "rule 'slow' did not return within its deadline of 3 s on this event", "aborted: the batch ran past within its deadline of 9 s",
    "PostgreSQL refused this event's writes at the commit: value too long",
    "the reactions to captured\ninsert on 'orders' cannot be committed: value too long",
    "", "why not", "aborted: ", "aborted:late: no space", "\nlate: after a newline", "100% _of_ nothing: %late:"]


def test_dead_letters_are_counted_per_kind_by_postgresql_in_one_query(database):
    """A scrape read every reason not yet replayed (``GROUP BY reason``: a row per distinct reason, and reasons name
    values, rules and ids, so about a row per letter) and classified them in Python — a table of a million letters
    made every scrape slow and heavy.  PostgreSQL classifies them now, by the patterns ``ReasonKind.of`` reads
    (``ReasonKind.sql``), and counts per kind in one query of at most a row per kind; the counts are those of
    ``ReasonKind.of``, for every kind."""
    from collections import Counter

    reasons = [reason for copies, reason in enumerate(_REASONS_OF_EACH_KIND, 1) for _ in range(copies % 3 + 1)]
    expected = Counter(ReasonKind.of(reason).value for reason in reasons)
    assert set(expected) == {kind.value for kind in ReasonKind}        # (every kind has letters)
    with database.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) "
                                   "VALUES ('q@1', 0, :reason, '{}')"), [{"reason": reason} for reason in reasons])
        connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw, replayed_at) "
                                   "VALUES ('q@1', 1, 'late: replayed', '{}', now())"))
    reads: list[tuple[str, int]] = []

    def heard(conn, cursor, statement, parameters, context, executemany):
        if "activedb_dead_letters" in statement:
            reads.append((statement, cursor.rowcount))

    with MetricsExporter(database) as exporter:
        sa.event.listen(database.engine, "after_cursor_execute", heard)
        try:
            values = samples(exporter.scrape())
        finally:
            sa.event.remove(database.engine, "after_cursor_execute", heard)
    letters = {dict(labels)["reason"]: value for (name, labels), value in values.items() if name == "activedb_dead_letters"}
    assert letters == dict(expected)
    assert len(reads) == 1, reads
    [(statement, rows)] = reads
    assert rows <= len(ReasonKind), f"the scrape's query returned {rows} rows: {statement}"


class _Consumer:
    """A watched capture consumer (``ConsumerSource``) named ``name``; its statistics fail while ``failing``."""

    def __init__(self, name: str, changes: int, failing: bool = False):
        self.name, self.changes, self.failing = name, changes, failing

    def statistics(self):
        if self.failing:
            raise RuntimeError("the source is gone")
        return types.SimpleNamespace(name=self.name, batches=1, changes=self.changes, firings=0, failed=0,
                                     lag_seconds=0.5)


def test_a_second_capture_consumer_of_one_name_is_refused_and_never_exported_twice(database):
    """Two watched capture consumers of one name exported two samples with one label set in every
    ``activedb_capture_consumer_*`` family — duplicate samples, an invalid exposition.  A second consumer of a name
    already watched is refused where it is watched (a MetricsError); one whose statistics could not be read then (it
    is watched still, and reported down while it fails) is left out of a scrape that exported its name already."""
    exporter = MetricsExporter(database)
    exporter.watch_consumer(_Consumer("orders", 3))
    with pytest.raises(MetricsError, match=r"capture consumer 'orders' is watched already"):
        exporter.watch_consumer(_Consumer("orders", 5))
    late = _Consumer("orders", 7, failing=True)
    exporter.watch_consumer(late)                     # cannot say its name now: taken
    exporter.watch_consumer(_Consumer("refunds", 2))
    late.failing = False
    text = exporter.scrape()
    changes = [line for line in text.splitlines() if line.startswith("activedb_capture_consumer_changes_total{")]
    assert sorted(changes) == ['activedb_capture_consumer_changes_total{consumer="orders"} 3.0',
                               'activedb_capture_consumer_changes_total{consumer="refunds"} 2.0']


@pytest.mark.parametrize("watch", ["watch_ingestion", "watch_consumer"])
@pytest.mark.parametrize("source", [None, "orders", 5])
def test_watching_what_is_no_source_is_refused_saying_what_to_give(database, watch, source):
    """``watch_ingestion(None)`` failed with a bare AttributeError, and ``watch_consumer(None)`` (or a consumer's name)
    was taken: every scrape then reported the capture consumers down, for good.  Each is now a MetricsError saying what
    to watch."""
    exporter = MetricsExporter(database)
    with pytest.raises(MetricsError, match=rf"{watch}\(.*\) takes"):
        getattr(exporter, watch)(source)
    values = samples(exporter.scrape())
    assert values[("activedb_metrics_source_up", (("source", "capture_consumers"),))] == 1


def test_one_capture_consumer_that_fails_hides_not_the_others(database):
    """A scrape reads every watched consumer: one whose ``statistics()`` raised took the samples of all the others
    out of that scrape with it (they formed one source), so one broken consumer blinded the monitoring of every
    consumer.  Now the failing one is left out and reported down; the others are exported."""
    exporter = MetricsExporter(database)
    exporter.watch_consumer(_Consumer("orders", 3))
    exporter.watch_consumer(_Consumer("broken", 1, failing=True))
    exporter.watch_consumer(_Consumer("refunds", 2))
    text = exporter.scrape()
    changes = [line for line in text.splitlines() if line.startswith("activedb_capture_consumer_changes_total{")]
    assert sorted(changes) == ['activedb_capture_consumer_changes_total{consumer="orders"} 3.0',
                               'activedb_capture_consumer_changes_total{consumer="refunds"} 2.0']
    assert samples(text)[("activedb_metrics_source_up", (("source", "capture_consumers"),))] == 0


def test_one_watched_ingestion_that_fails_hides_not_the_others(database):
    """As with capture consumers: the watched ingestions were read as one source, so one whose ``statistics()``
    raised took every other ingestion's samples out of the scrape.  Now it is left out, reported down; the others
    are exported."""
    from activedb.ingest import Ingestion

    def gone():
        raise RuntimeError("the source is gone")

    exporter = MetricsExporter(database)
    working, broken = (Ingestion(database, source=name) for name in ("orders", "broken"))
    try:
        exporter.watch_ingestion(working)
        exporter.watch_ingestion(broken)
        broken.statistics = gone
        values = samples(exporter.scrape())
        assert {labels for name, labels in values if name == "activedb_ingest_batches_total"} == {
            (("query", "orders"),)}
        assert values[("activedb_metrics_source_up", (("source", "ingestion"),))] == 0
    finally:
        for ingestion in (working, broken):
            ingestion.close()


def test_an_ingestion_that_fails_when_watched_is_watched_still_and_never_exported_twice(database):
    """``watch_ingestion`` read the source's ``statistics()`` unguarded, where ``watch_consumer`` tolerates a source
    that fails then: the source's own error (here a RuntimeError, no ActivedbError) came out of watch_ingestion, and
    the command or program that watched it failed to start.  Now it is watched still, reported down while it fails,
    and exported once it answers — unless its query name was exported already by another, then it is left out."""
    from activedb.ingest import Ingestion

    def gone():
        raise RuntimeError("the source is gone")

    exporter = MetricsExporter(database)
    first, late, twin = (Ingestion(database, source=name) for name in ("orders", "refunds", "orders"))
    try:
        exporter.watch_ingestion(first)
        for source in (late, twin):
            answer = source.statistics
            source.statistics = gone
            exporter.watch_ingestion(source)            # cannot say its query name now: taken
            source.statistics = answer
        late.statistics, answer = gone, late.statistics
        values = samples(exporter.scrape())
        assert values[("activedb_metrics_source_up", (("source", "ingestion"),))] == 0
        late.statistics = answer
        text = exporter.scrape()
        batches = [line for line in text.splitlines() if line.startswith("activedb_ingest_batches_total{")]
        assert sorted(batches) == ['activedb_ingest_batches_total{query="orders"} 0.0',
                                   'activedb_ingest_batches_total{query="refunds"} 0.0']
        assert samples(text)[("activedb_metrics_source_up", (("source", "ingestion"),))] == 1
    finally:
        for ingestion in (first, late, twin):
            ingestion.close()


def test_a_second_start_of_a_serving_exporter_is_refused_naming_where_it_serves(database):
    with MetricsExporter(database) as exporter:
        url = exporter.start("127.0.0.1:0")
        with pytest.raises(MetricsError, match=rf"the metrics endpoint already runs at {url}"):
            exporter.start("127.0.0.1:0")
        assert exporter.url == url
        assert "activedb_rule_firings_total" in scrape(url)


@pytest.mark.parametrize("bad", ["abc", "99999", "localhost:abc", "[::1]"])
def test_a_metrics_port_that_is_no_port_is_refused_naming_the_value_and_the_port_range(bad):
    """``--metrics-port 99999`` was refused with "Invalid value for '--metrics-port': give a port (e.g. 9464) or
    ADDRESS:PORT …": the value given was cut from the message (click's other usage errors name it) and nothing said
    that 99999, which reads as a port, is beyond the ports there are. The message names the value and the range."""
    from click.testing import CliRunner

    from activedb.cli import main

    result = CliRunner().invoke(main, ["capture", "consume", "app.py", "--metrics-port", bad])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--metrics-port': {bad!r} is no [ADDRESS:]PORT: give a port (e.g. 9464)" \
        in result.output, result.output
    assert "a port is 0 to 65535" in result.output, result.output
