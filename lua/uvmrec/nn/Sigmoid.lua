-- uvmrec.nn.Sigmoid: y = 1 / (1 + e^-x), computed without overflow at any x.
local Sigmoid = require("uvmrec.nn.Activation"):extend("Sigmoid")
Sigmoid.act = "sigmoid"

return Sigmoid
