-- 0012: tokens and cost (issue 36). Each sampled turn records the prompt tokens its policy call read (the whole
-- context: the rendered prompt plus every earlier turn, what an API bills as prompt tokens); its sampled tokens are
-- its token ids. Each session records the name of the model that served it, which the price table
-- (RUBRICEM_PRICES) prices. Both are NULL for rows written before this migration (their cost is unknown under a
-- non-empty price table); prompt_tokens is also NULL for turns that were not sampled (forced tags, tool output).
ALTER TABLE turns ADD COLUMN prompt_tokens INTEGER CHECK (prompt_tokens IS NULL OR prompt_tokens >= 0);

ALTER TABLE sessions ADD COLUMN policy_model TEXT;
