-- A refresh of a person's OAuth token under way, and until when: one replica at a time
-- refreshes a token (a rotated refresh token used twice would be seen as stolen).
ALTER TABLE credentials ADD COLUMN refreshing_until_ms BIGINT;
