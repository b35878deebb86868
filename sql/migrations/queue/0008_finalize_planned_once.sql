-- Migration 8 of the queue's database: the claims a success finalizes, as rows estimated at one.
-- job_succeed reads its group of claims from two arrays. unnest() over a parameter is estimated at ten
-- rows, so the statement's generic plan looked ten times as costly as the custom plans (which see the
-- real array, nearly always of one claim: a group forms only when commits queue up), and PostgreSQL
-- planned it afresh on every finalize: 0.3 ms of a no-op job's 1.9 on this project's machine. A function
-- the planner cannot look into (plpgsql), declared to return one row, prices the generic plan like the
-- custom ones: planned once per connection, the finalize 1.03 -> 0.73 ms. A larger group still gets the
-- plan a small one needs, index lookups by id and lease token, which is the right plan for any group.
CREATE FUNCTION claims_given(job_ids uuid[], lease_tokens uuid[])
RETURNS TABLE (job_id uuid, lease_token uuid, given_order bigint)
LANGUAGE plpgsql IMMUTABLE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(job_ids, lease_tokens) WITH ORDINALITY;
END
$$;
