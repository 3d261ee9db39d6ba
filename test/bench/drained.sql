-- 1 while a message is pending or processing, 0 once the queue is drained: how make bench
-- (bench.py), dispatch_bench.sh and worker_instructions.sh watch a drain, every 50-200 ms.
-- Index scans only: leased rows are asked for as lease_until IS NOT NULL (the same rows as
-- status = 'processing', by messages_lease_check, and the predicate of messages_leased);
-- status = 'processing' matches no index's predicate, and with 1,000,000 done rows it was a
-- parallel scan of the whole table (0.4 s on three processes) every look once nothing was
-- pending, taken from the last finalizes of the drain being timed; a scan of a small table
-- also prunes the pages the workers update, more often the smaller the table.
SELECT (EXISTS (SELECT 1 FROM outbox.messages WHERE status = 'pending')
        OR EXISTS (SELECT 1 FROM outbox.messages WHERE lease_until IS NOT NULL))::int;
