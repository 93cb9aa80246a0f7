// `libreyolo profile <subcommand>`: the readers of profile.json / raw traces. Options are
// written `--name value` (this command follows LibreYOLO's `profile` sub-app, not the key=value
// grammar). Exit codes: 0 ok, 2 bad file or arguments, 3 no profile produced, 1 a trace that
// cannot be analysed.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace libreyolo::profile {

// `args` are the words after "profile".
int run_profile_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace libreyolo::profile
