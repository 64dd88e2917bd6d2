-- The nginx front's per-request work (lua-nginx-module, LuaJIT): the bearer key, the drain state, the counts the
-- gateway reads (requests in flight, last arrival) and the request-duration histogram. Configured by
-- serving/kserve_runtime/nginx_front.py, which renders nginx.conf and calls M.init with the served model.
local bit = require "bit"

local M = {}
local state = ngx.shared.front

local expected   -- HMAC of the expected key under a per-process secret; nil = no key required
local secret
local model, versions, default_version, buckets

-- Constant-time in the key: both sides are HMACed with a random secret and the digests compared byte by byte
-- without an early exit, so the time taken says nothing about how much of a guess was right.
local function digest(value)
    return ngx.hmac_sha1(secret, value)
end

local function same(a, b)
    local diff = 0
    for i = 1, #a do
        diff = bit.bor(diff, bit.bxor(a:byte(i), b:byte(i)))
    end
    return diff == 0
end

function M.init(settings)
    local key = os.getenv("INFERENCE_API_KEY")
    local f = assert(io.open("/dev/urandom", "rb"))
    secret = f:read(32)
    f:close()
    if settings.require_key then
        key = key and key:match("^%s*(.-)%s*$") or ""
        if key == "" then
            error("INFERENCE_API_KEY is empty but the front requires a key")
        end
        expected = digest(key)
    end
    model, versions, default_version, buckets = settings.model, settings.versions, settings.default_version,
        settings.buckets
end

local function answer(status, message)
    ngx.ctx.refused = message
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.say(string.format('{"error": "%s"}', message))
    return ngx.exit(status)
end

-- The key a request presents, as serving/gateway/auth.py's presented_key: its one X-API-Key value if it sends that
-- header (behind Kubeflow's ingress, Authorization carries the caller's JWT), else the Bearer value of its one
-- Authorization header; nil otherwise. A header sent twice reaches ngx.req.get_headers() as a table.
local function presented_key()
    local headers = ngx.req.get_headers()
    local own = headers["x-api-key"]
    if own ~= nil then
        return type(own) == "string" and own:match("^%s*(.-)%s*$") or nil
    end
    local header = headers["authorization"]
    if type(header) ~= "string" then
        return nil
    end
    local scheme, rest = header:match("^([^ ]*) ?(.*)$")
    if (scheme or ""):lower() ~= "bearer" then
        return nil
    end
    return (rest or ""):match("^%s*(.-)%s*$")
end

-- Every request but the probes: drain state first (as the gateway's outer middleware), then the key. While the
-- pod drains, a request jumps to `closing`, the same route with keepalive_timeout 0, so that its answer closes
-- the connection (nginx decides keep-alive per location; no header set here would change it).
function M.access(closing)
    local drain = state:get("drain")
    if drain then
        if closing then
            return ngx.exec(closing)
        end
        if drain == "refusing" then
            state:set("last_arrival", ngx.now())
            return answer(503, "this replica is shutting down; retry")
        end
    end
    if expected and not same(digest(presented_key() or ""), expected) then
        return answer(401, "missing or wrong API key: send X-API-Key: <key>, or Authorization: Bearer <key> "
                           .. "without a gateway")
    end
    state:incr("in_flight", 1, 0)
    ngx.ctx.counted = true
    state:set("last_arrival", ngx.now())
end

local function labels(uri)
    local m, v = uri:match("^/v1/models/([^/:]+):predict$")
    if not m then
        m = uri:match("^/predictions/([^/]+)$")
    end
    if not m then
        m, v = uri:match("^/predictions/([^/]+)/([^/]+)$")
    end
    if not m then
        m = uri:match("^/v2/models/([^/]+)/infer$")
        if not m then
            m, v = uri:match("^/v2/models/([^/]+)/versions/([^/]+)/infer$")
        end
    end
    if m ~= model then
        return nil
    end
    if v == nil then
        v = default_version
    end
    return versions[v] and v or nil
end

-- Log phase: count the request out and observe its duration under (version, status), served models only.
function M.log()
    -- A refusal nginx answered itself: the one line per refused request (handler/log_lines.py's shape).
    if ngx.ctx.refused then
        ngx.log(ngx.WARN, "refused request ", ngx.req.get_method(), " ", ngx.var.uri, ": ", ngx.status, " ",
                ngx.ctx.refused)
    end
    if ngx.ctx.counted then
        state:incr("in_flight", -1, 0)
        state:set("last_arrival", ngx.now())
    end
    local version = labels(ngx.var.uri)
    if not version then
        return
    end
    local seconds = tonumber(ngx.var.request_time) or 0
    local slot = #buckets + 1
    for i = 1, #buckets do
        if seconds <= buckets[i] then
            slot = i
            break
        end
    end
    local prefix = "h|" .. version .. "|" .. ngx.var.status .. "|"
    state:incr(prefix .. slot, 1, 0)
    state:incr(prefix .. "sum", seconds, 0)
end

-- The control socket: GET answers the state as "name value" lines (the histogram's as "h|version|status|slot
-- count"); PUT ?drain=draining|refusing sets the drain state first.
function M.control()
    if ngx.req.get_method() == "PUT" then
        local drain = ngx.var.arg_drain
        if drain ~= "draining" and drain ~= "refusing" then
            return answer(400, "drain must be draining or refusing")
        end
        state:set("drain", drain)
    end
    ngx.header["Content-Type"] = "text/plain"
    ngx.say("drain ", state:get("drain") or "serving")
    ngx.say("in_flight ", state:get("in_flight") or 0)
    ngx.say("since_last_arrival ", ngx.now() - (state:get("last_arrival") or 0))
    for _, key in ipairs(state:get_keys(0)) do
        if key:sub(1, 2) == "h|" then
            ngx.say(key, " ", state:get(key))
        end
    end
end

return M
