-- ddl.sql: the mark table and its check function; {{.Table}} and {{.Func}} are the
-- (possibly schema-qualified) names, validated identifiers.
CREATE TABLE IF NOT EXISTS {{.Table}} (
	resource text PRIMARY KEY,
	token numeric(20,0) NOT NULL CHECK (token BETWEEN 1 AND 18446744073709551615)
);
CREATE OR REPLACE FUNCTION {{.Func}}(resource_name text, new_token numeric) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
	cur numeric;
BEGIN
	IF new_token IS NULL OR new_token < 1 OR new_token > 18446744073709551615 OR new_token <> trunc(new_token) THEN
		RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('dlock fence: invalid token %s (want 1 to 18446744073709551615)', new_token);
	END IF;
	INSERT INTO {{.Table}} AS f (resource, token) VALUES (resource_name, new_token)
		ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token;
	IF NOT FOUND THEN
		SELECT f.token INTO cur FROM {{.Table}} AS f WHERE f.resource = resource_name;
		RAISE EXCEPTION USING ERRCODE = 'DL001', DETAIL = cur::text,
			MESSAGE = format('dlock fence: stale token: resource %L: token %s is lower than %s, which it has accepted', resource_name, new_token, cur);
	END IF;
END
$fn$;
