// The main of the LibTorch-free test executables (text, chat templates, the GGUF reader):
// nothing to configure first.
#include "catch_session.h"

int main(int argc, char* argv[]) { return refit_test::run_catch_session(argc, argv); }
