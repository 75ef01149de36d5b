"""The hand-hygiene application as PL/pgSQL row triggers: the peer ``activedb bench ingest`` measures.

What a PostgreSQL user would write instead of activedb: badge events go into ``hh_badge_events`` (by
``COPY``, one transaction per micro-batch, rows in timestamp order), and a ``BEFORE INSERT`` row trigger
applies ``activedb.examples.hand_hygiene.app``'s logic to the application's own tables (the hand-hygiene
migrations create them): validation and tracking (``track_badge``), the three transitions, the alert and
the audit row (deferred rules there), the badge notification (detached), the badge light (detached
causally dependent), the incident report (sequential causally dependent) — all as inserts in the same
transaction — and, for a rejected event, its compensation (exclusive causally dependent) instead of the
event.  Accepted events are kept in ``hh_badge_events``.
"""
from alembic import op

revision = "b0005"
down_revision = "b0004"

FUNCTION = r"""
CREATE FUNCTION hh_apply_badge_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    w worker_status%ROWTYPE;
    rejected boolean := false;
    old_status text;
    new_status text := NULL;
    alert_id bigint;
BEGIN
    IF NEW.worker IS NULL OR NEW.worker = '' THEN
        rejected := true;
    ELSE
        SELECT * INTO w FROM worker_status WHERE worker = NEW.worker FOR UPDATE;
        IF NOT FOUND THEN                       -- a badge seen for the first time: safe, in the corridor
            w.worker := NEW.worker;
            w.status := 'safe';
            w.changes := 0;
        END IF;
        IF w.last_ts IS NOT NULL AND NEW.ts < w.last_ts THEN
            rejected := true;                   -- older than the worker's last applied event
        ELSIF NEW.type = 'enter' THEN
            IF NEW.room IS NULL OR NEW.room = '' OR w.room IS NOT NULL THEN
                rejected := true;
            ELSE
                w.room := NEW.room;
            END IF;
        ELSIF NEW.type = 'exit' THEN
            IF w.room IS DISTINCT FROM NEW.room THEN
                rejected := true;
            ELSE
                w.room := NULL;
                w.last_exit_room := NEW.room;
                w.last_exit_ts := NEW.ts;
            END IF;
        ELSIF NEW.type = 'sanitize' THEN
            w.last_sanitize_ts := NEW.ts;
        ELSIF NEW.type = 'mask' THEN
            w.last_mask_ts := NEW.ts;
        END IF;
    END IF;
    IF rejected THEN                            -- the compensation, instead of the event
        INSERT INTO compensations (worker, event, at, reason) VALUES (
            coalesce(NEW.worker, 'None'), NEW.type, coalesce(NEW.ts, 0),
            NEW.type || CASE WHEN coalesce(NEW.room, '') <> '' THEN ' ' || NEW.room ELSE '' END
                || ' at t=' || NEW.ts || ' was rejected: badge reader flagged for re-sync, worker asked to badge again');
        RETURN NULL;
    END IF;
    w.last_event := NEW.type;
    w.last_ts := NEW.ts;
    old_status := w.status;
    IF NEW.type = 'enter' AND w.status = 'safe' AND w.last_exit_ts IS NOT NULL THEN
        IF NEW.ts - w.last_exit_ts <= 45.0 AND w.last_exit_room IS DISTINCT FROM NEW.room
           AND NOT (w.last_sanitize_ts IS NOT NULL AND w.last_sanitize_ts >= w.last_exit_ts) THEN
            new_status := 'warning';
        END IF;
    ELSIF NEW.type = 'exit' AND w.status = 'warning' THEN
        IF NOT (w.last_mask_ts IS NOT NULL AND NEW.ts - w.last_mask_ts BETWEEN 0.0 AND 5.0) THEN
            new_status := 'violation';
        END IF;
    ELSIF NEW.type = 'sanitize' AND w.status <> 'safe' THEN
        new_status := 'safe';
    END IF;
    IF new_status IS NOT NULL THEN
        w.status := new_status;
        w.status_ts := NEW.ts;
        w.changes := w.changes + 1;
    END IF;
    INSERT INTO worker_status (worker, status, room, last_event, last_ts, changes, status_ts, last_exit_room,
                               last_exit_ts, last_sanitize_ts, last_mask_ts)
    VALUES (w.worker, w.status, w.room, w.last_event, w.last_ts, w.changes, w.status_ts, w.last_exit_room,
            w.last_exit_ts, w.last_sanitize_ts, w.last_mask_ts)
    ON CONFLICT (worker) DO UPDATE SET status = EXCLUDED.status, room = EXCLUDED.room,
        last_event = EXCLUDED.last_event, last_ts = EXCLUDED.last_ts, changes = EXCLUDED.changes,
        status_ts = EXCLUDED.status_ts, last_exit_room = EXCLUDED.last_exit_room,
        last_exit_ts = EXCLUDED.last_exit_ts, last_sanitize_ts = EXCLUDED.last_sanitize_ts,
        last_mask_ts = EXCLUDED.last_mask_ts;
    IF new_status IS NOT NULL THEN
        IF new_status = 'violation' THEN
            INSERT INTO alerts (worker, kind, at) VALUES (NEW.worker, 'violation', NEW.ts) RETURNING id INTO alert_id;
            INSERT INTO notifications (worker, channel, at, message) VALUES (
                NEW.worker, 'badge', NEW.ts, 'hygiene violation at t=' || NEW.ts || ': sanitize your hands now');
            INSERT INTO notifications (worker, channel, at, message) VALUES (
                NEW.worker, 'infection_control', NEW.ts,
                'incident: ' || NEW.worker || ' in hygiene violation at t=' || NEW.ts || ' (alert ' || alert_id || ')');
        END IF;
        INSERT INTO status_changes (worker, old_status, new_status, event, at)
        VALUES (NEW.worker, old_status, new_status, NEW.type, NEW.ts);
        INSERT INTO badge_lights (worker, color, status, at) VALUES (
            NEW.worker, CASE new_status WHEN 'safe' THEN 'green' WHEN 'warning' THEN 'yellow' ELSE 'red' END,
            new_status, NEW.ts);
    END IF;
    RETURN NEW;
END
$$
"""


def upgrade() -> None:
    op.execute("""
        CREATE TABLE hh_badge_events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            type text, worker text, ts double precision, room text)
    """)
    # The body names the hand-hygiene tables, which may not exist yet (benchmarks that do not use them):
    # PostgreSQL resolves them when the trigger first runs.
    op.execute("SET LOCAL check_function_bodies = off")
    op.execute(FUNCTION)
    op.execute("CREATE TRIGGER hh_badge_events_apply BEFORE INSERT ON hh_badge_events "
               "FOR EACH ROW EXECUTE FUNCTION hh_apply_badge_event()")


def downgrade() -> None:
    op.execute("DROP TABLE hh_badge_events")
    op.execute("DROP FUNCTION hh_apply_badge_event()")
