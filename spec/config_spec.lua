local config = require "uvmrec.config"

local schema = config.map({
  name = config.string { pattern = "^[%w_]+$" },
  model = config.map({
    bottom_mlp = config.list(config.int { min = 1 }, { min_len = 1 }),
    interaction = config.enum({ "dot", "dcnv2" }, { default = "dot" }),
    dropout = config.number { min = 0, max = 1, default = 0 },
    tables = config.dict(config.map({ rows = config.int { min = 1 }, dim = config.int { min = 4 } },
                                    { required = { "rows" } })),
  }, { required = { "bottom_mlp" } }),
  train = config.map({
    batch_size = config.int { min = 1, default = 128 },
    lr = config.number { min = 0, default = 0.1 },
    shuffle = config.bool { default = true },
  }),
}, { required = { "model" } })

local function parse(text) return config.parse(text, schema, "t.yaml") end

describe("uvmrec.config", function()
  it("types a scalar by its text where the schema leaves it open (config.scalar)", function()
    local open = config.map { opts = config.dict(config.scalar {}) }
    local cfg = assert(config.parse([[
opts: {a: 1.5, b: -2, c: true, d: false, e: slow, f: '0.5', g: "true", h: 1e3}
]], open, "t.yaml"))
    assert.same({ a = 1.5, b = -2, c = true, d = false, e = "slow", f = "0.5", g = "true", h = 1000 }, cfg.opts)
    local _, err = config.parse("opts: {a: [1, 2]}\n", open, "t.yaml")
    assert.equal("t.yaml:1:11: opts.a: expected a number, a string, true or false", err)
    _, err = config.parse("opts: {a: 1e999}\n", open, "t.yaml")
    assert.equal("t.yaml:1:11: opts.a: '1e999' is not a finite number", err)
    cfg = assert(config.parse("opts: {}\n", open, "t.yaml"))
    assert(config.set(cfg, open, "opts.x=on"))
    assert(config.set(cfg, open, "opts.y=0.25"))
    assert(config.set(cfg, open, "opts.z=false"))
    assert.same({ x = "on", y = 0.25, z = false }, cfg.opts)
  end)

  it("types every value by the schema and fills defaults", function()
    local cfg = assert(parse([[
name: tiny_1
model:
  bottom_mlp: [13, 512, 64]
  tables:
    C1: {rows: 1000, dim: 16}
    C2:
      rows: 20
train:
  lr: 1.5e-2
  shuffle: false
]]))
    assert.same({ 13, 512, 64 }, cfg.model.bottom_mlp)
    assert.same({ "dot", 0 }, { cfg.model.interaction, cfg.model.dropout })
    assert.same({ rows = 1000, dim = 16 }, cfg.model.tables.C1)
    assert.same({ 128, 0.015, false }, { cfg.train.batch_size, cfg.train.lr, cfg.train.shuffle })
  end)

  it("treats yes, 010 and 0x1F as what the schema asks for, not YAML 1.1's guesses", function()
    local cfg = assert(parse("name: yes\nmodel: {bottom_mlp: [10]}\n"))
    assert.equal("yes", cfg.name)
    local _, err = parse("model: {bottom_mlp: [010]}\n")
    assert.equal("t.yaml:1:22: model.bottom_mlp[1]: '010' is not a decimal integer", err)
    _, err = parse("model: {bottom_mlp: [1]}\ntrain: {shuffle: yes}\n")
    assert.equal("t.yaml:2:18: train.shuffle: 'yes' is not true or false", err)
    _, err = parse("model: {bottom_mlp: [0x1F]}\n")
    assert.matches("'0x1F' is not a decimal integer", err)
    _, err = parse("model: {bottom_mlp: ['5']}\n")
    assert.matches("'5' is not an integer %(not a quoted string%)", err)
  end)

  local cases = {
    { "unknown key", "model: {bottom_mlp: [1]}\ntrian: {lr: 1}\n",
      "t.yaml:2:1: unknown key 'trian'; expected one of model, name, train" },
    { "wrong type", "model: {bottom_mlp: 7}\n", "t.yaml:1:21: model.bottom_mlp: expected a list" },
    { "impossible value", "model: {bottom_mlp: [1]}\ntrain: {batch_size: 0}\n",
      "t.yaml:2:21: train.batch_size: '0' is not an integer >= 1" },
    { "duplicate key", "model: {bottom_mlp: [1]}\nmodel: {bottom_mlp: [2]}\n",
      "t.yaml:2:1: duplicate key 'model' (first at line 1)" },
    { "anchor", "model: &m {bottom_mlp: [1]}\n", "t.yaml:1:8: anchors (&name) are not allowed in a config" },
    { "alias", "model: {bottom_mlp: [1]}\nname: *n\n",
      "t.yaml:2:7: aliases (*name) are not allowed in a config; write the value out" },
    { "missing key", "train: {lr: 1}\n", "t.yaml:1:1: missing key 'model'" },
    { "tag", "model: {bottom_mlp: [!!int 3]}\n",
      "t.yaml:1:22: model.bottom_mlp[1]: tags (!!type) are not allowed; the schema gives each value its type" },
    { "two documents", "model: {bottom_mlp: [1]}\n---\nname: x\n",
      "t.yaml:2:1: a second document; a config holds one" },
    { "syntax", "model: {bottom_mlp: [1}\n", "t.yaml:1:" },
    { "empty", "", "t.yaml:1:1: the document is empty" },
    { "bad enum", "model: {bottom_mlp: [1], interaction: cat}\n",
      "t.yaml:1:39: model.interaction: 'cat' is not one of dot, dcnv2" },
    { "required in a dict entry", "model: {bottom_mlp: [1], tables: {C1: {dim: 8}}}\n",
      "t.yaml:1:39: model.tables.C1: missing key 'rows'" },
  }
  for _, c in ipairs(cases) do
    it("rejects a config with " .. c[1] .. ", naming file:line:column", function()
      local cfg, err = parse(c[2])
      assert.is_nil(cfg)
      assert.equal(c[3], err:sub(1, #c[3]))
    end)
  end

  it("rejects nesting deeper than 64 levels", function()
    local cfg, err = parse(("[" ):rep(70) .. ("]"):rep(70) .. "\n")
    assert.is_nil(cfg)
    assert.matches("^t.yaml:1:65: nesting deeper than 64 levels", err)
  end)

  it("checks a decoded value's types against the schema, naming the path and what it should be", function()
    -- a config a file holds as JSON (train.config.stored): its values have their types already
    local json = require "uvmrec.json"
    local function check(text) return config.check_value(assert(json.decode(text)), schema) end
    assert.is_nil(check('{"model":{"bottom_mlp":[3,4],"tables":{"C1":{"rows":9,"dim":4}}},"train":{"lr":0.5}}'))
    assert.is_nil(check('{"model":{"bottom_mlp":[3],"tables":{}},"train":{},"newer":{"a":1}}'),
                  "an empty table is an empty mapping; keys it does not know are left alone")
    for _, c in ipairs {
      { '{"model":5}', "model: 5 is not a mapping" },
      { '{"model":[1]}', "model: a list is not a mapping" },
      { '{"model":{"bottom_mlp":"x"}}', 'model.bottom_mlp: "x" is not a list' },
      { '{"model":{"bottom_mlp":{"a":1}}}', "model.bottom_mlp: a mapping is not a list" },
      { '{"model":{"bottom_mlp":[]}}', "model.bottom_mlp: expected at least 1 items, got 0" },
      { '{"model":{"bottom_mlp":[3,0]}}', "model.bottom_mlp[2]: 0 is not an integer >= 1" },
      { '{"model":{"bottom_mlp":[3.5]}}', "model.bottom_mlp[1]: 3.5 is not an integer" },
      { '{"model":{"bottom_mlp":[9007199254740993]}}',
        "model.bottom_mlp[1]: 9007199254740993LL is not an integer below 2^53" },
      { '{"model":{"bottom_mlp":[[3]]}}', "model.bottom_mlp[1]: a list is not an integer" },
      { '{"model":{"bottom_mlp":[3],"interaction":"cross"}}', 'model.interaction: "cross" is not one of dot, dcnv2' },
      { '{"model":{"bottom_mlp":[3],"dropout":"0.5"}}', 'model.dropout: "0.5" is not a number' },
      { '{"model":{"bottom_mlp":[3],"dropout":2}}', "model.dropout: 2 is not a number <= 1" },
      { '{"model":{"bottom_mlp":[3],"tables":{"C1":{"dim":4}}}}', "model.tables.C1: missing key 'rows'" },
      { '{"model":{"bottom_mlp":[3],"tables":[{"rows":1}]}}', "model.tables: a list is not a mapping" },
      { '{"model":{"bottom_mlp":[3]},"train":{"shuffle":"yes"}}', 'train.shuffle: "yes" is not true or false' },
      { '{"model":{"bottom_mlp":[3]},"name":"a b"}', 'name: "a b" is not a string matching ^[%w_]+$' },
      { '{"model":{"bottom_mlp":[3]},"name":7}', "name: 7 is not a string" },
      { '{"train":{}}', "missing key 'model'" },
      { "5", "5 is not a mapping" },
    } do
      assert.equal(c[2], check(c[1]), c[1])
    end
  end)

  it("reads files, and reports a missing one", function()
    local path = os.tmpname()
    local f = io.open(path, "w")
    f:write("model:\n  bottom_mlp: [3, 4]\n  interaction: dcnv2\n")
    f:close()
    local cfg = assert(config.load(path, schema))
    assert.same({ "dcnv2", { 3, 4 } }, { cfg.model.interaction, cfg.model.bottom_mlp })
    os.remove(path)
    local none, err = config.load(path, schema)
    assert.is_nil(none)
    assert.matches(": cannot open: No such file or directory$", err)
  end)

  it("tells where each value came from, for checks made after loading", function()
    local cfg = assert(parse("model:\n  bottom_mlp: [13, 64]\n  tables: {C1: {rows: 9}}\n"))
    assert.equal("t.yaml:2:20", config.where(cfg, "model.bottom_mlp[2]"))
    assert.equal("t.yaml:2:15", config.where(cfg, "model.bottom_mlp"))
    assert.equal("t.yaml:2:3", config.where(cfg, "model.dropout"), "a default: its section's position")
    assert.equal("t.yaml:2:3: model.dropout: too high", config.message(cfg, "model.dropout", "too high"))
    assert(config.set(cfg, schema, "model.bottom_mlp=7,8,9"))
    assert(config.set(cfg, schema, "model.tables.C2.rows=5"))
    assert.same({ rows = 5 }, cfg.model.tables.C2, "a --set makes the dict entry it names")
    assert.equal("--set model.bottom_mlp=7,8,9", config.where(cfg, "model.bottom_mlp[3]"))
    assert.equal("--set model.tables.C2.rows=5", config.where(cfg, "model.tables.C2"))
    assert.is_nil(config.where({}, "model"))
  end)

  it("sets any value from the command line through the same schema", function()
    local cfg = assert(parse("model: {bottom_mlp: [1]}\n"))
    assert(config.set(cfg, schema, "train.batch_size=4096"))
    assert(config.set(cfg, schema, "model.bottom_mlp=512,256,128"))
    assert(config.set(cfg, schema, "train.shuffle=false"))
    assert.same({ 4096, { 512, 256, 128 }, false },
      { cfg.train.batch_size, cfg.model.bottom_mlp, cfg.train.shuffle })
    for set, msg in pairs {
      ["train.batch_size=big"] = "--set train.batch_size=big: 'big' is not a decimal integer",
      ["train.bach=3"] = "--set train.bach=3: 'train.bach' is not a setting",
      ["train=3"] = "--set train=3: 'train' is a section; set one of its keys",
      ["train.lr"] = "--set train.lr: expected key.path=value",
      ["model.bottom_mlp=1,x"] = "--set model.bottom_mlp=1,x: 'x' is not a decimal integer",
    } do
      local ok, err = config.set(cfg, schema, set)
      assert.is_nil(ok)
      assert.equal(msg, err)
    end
  end)
end)
