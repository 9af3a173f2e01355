# Writes ${OUT} (attic_version.h) with the checkout's commit, run at every build so
# `attic --version` names the commit the binary was built from. configure_file only
# rewrites the header when its text changes, so an unchanged commit rebuilds nothing.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE ATTIC_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR ATTIC_GIT_COMMIT STREQUAL "")
  set(ATTIC_GIT_COMMIT "unknown")
endif()
configure_file("${SRC}/cmake/attic_version.h.in" "${OUT}" @ONLY)
