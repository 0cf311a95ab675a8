#pragma once
// The framework uses the SDK's guard (include/refit/autocast.h).
#include "refit/autocast.h"
