// The dino plugin: DINO self-distillation (the DINO head model and the dino objective). The
// teacher is declared in the recipe as EMA models of the student's ("ema": {"of": ...}); the
// framework updates them after every optimizer update that was not skipped.
#include "dino_head.h"
#include "dino_objective.h"
#include "refit/plugin.h"

namespace {

void register_dino(refit::Registry& r) {
  r.models.add("dino_head",
               "DINO projection head: MLP, L2-normalised bottleneck, weight-normalised prototypes (out_dim); "
               "DINO parameter names",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::dino::DinoHeadOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::dino::DinoHead>(o); };
               });
  r.objectives.add("dino",
                   "DINO self-distillation: student chain on all crops, EMA teacher chain on global crops, "
                   "centred and sharpened teacher targets",
                   [](const refit::ConfigReader& c) -> refit::Builder<refit::Objective> {
                     auto o = refit::dino::DinoObjectiveOptions::from_config(c);
                     return [o](const refit::BuildContext&) { return std::make_shared<refit::dino::DinoObjective>(o); };
                   });
}

}  // namespace

REFIT_PLUGIN("dino", "0.1.0", register_dino)
