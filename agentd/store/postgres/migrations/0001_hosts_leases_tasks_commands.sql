-- 0001: the hosts, their leases, tasks, and commands carried between hosts (_leases.py, _tasks.py, _mailbox.py).
-- schema_migrations itself is created by the runner (_migrate.py). Times are the database's clock.

-- One row per agentd instance that uses this database ("owner", as in leases.owner): its heartbeat.
-- Renewed with its leases, in the same round; a host whose expires_at passed is dead to the others.
CREATE TABLE hosts (
    owner       text PRIMARY KEY,
    hostname    text NOT NULL,
    pid         integer NOT NULL,
    -- the state dir it runs on ("<hostname>:<state dir>"): an instance holding that state dir's lock knows
    -- every other instance of the same site is dead, and takes over their leases without waiting
    site        text NOT NULL DEFAULT '',
    -- the providers it can run (tasks are claimed only by a host that offers theirs)
    providers   text[] NOT NULL DEFAULT '{}',
    started_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    data        jsonb NOT NULL DEFAULT '{}'
);

-- One row per leased key (a conversation id): who holds it until when. A row whose expires_at passed
-- is free to be taken over; the taker learns whose it was (LeaseOutcome.previous_owner).
CREATE TABLE leases (
    key          text PRIMARY KEY,
    owner        text NOT NULL,
    pid          integer NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    data         jsonb NOT NULL DEFAULT '{}'
);
-- renewal (UPDATE ... WHERE owner = $1) and the sweep for expired leases of other owners
CREATE INDEX leases_owner ON leases (owner);
CREATE INDEX leases_expires_at ON leases (expires_at);

-- One row per task (wire.TaskRecord as JSON, the bytes the file store keeps in tasks/<id>.json),
-- with the columns a claim looks at. claimed_by is the owner running it ('' while queued).
CREATE TABLE tasks (
    id          text PRIMARY KEY,
    provider    text NOT NULL,
    status      text NOT NULL,
    created_at  text NOT NULL,   -- RFC 3339 UTC, as in the record: sorts as time
    claimed_by  text NOT NULL DEFAULT '',
    record      bytea NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- the queue: oldest pending task of a provider nobody claimed
CREATE INDEX tasks_queue ON tasks (provider, created_at) WHERE status = 'pending' AND claimed_by = '';

-- Commands carried to a conversation's lease holder (_mailbox.py): a host that is asked to send, answer,
-- cancel or steer on a conversation another host holds posts the request here for that host ("target"),
-- which takes it, runs it and writes the response. state: queued -> taken -> answered | failed, or
-- queued -> expired (the sender gave up before anyone took it: nothing ran).
CREATE TABLE commands (
    id               bigserial PRIMARY KEY,
    conversation_id  text NOT NULL,
    target           text NOT NULL,
    sender           text NOT NULL,
    op               text NOT NULL,
    request          bytea NOT NULL,
    state            text NOT NULL DEFAULT 'queued',
    response         bytea,
    error            text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    deadline         timestamptz NOT NULL,
    done_at          timestamptz
);
-- what a holder takes: its queued commands, oldest first
CREATE INDEX commands_queued ON commands (target, id) WHERE state = 'queued';
