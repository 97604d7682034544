# Defines the imported targets nibble::pcre2 and nibble::icu. NIBBLE_STATIC_UNICODE links both from
# their static archives even where pkg-config offers the shared ones: binaries that run on a machine
# without them (scripts/pack-prebuilt's, for the GPU machine, which has no ICU).
option(NIBBLE_STATIC_UNICODE "Link PCRE2 and ICU statically" OFF)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND AND NOT NIBBLE_STATIC_UNICODE)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET GLOBAL libpcre2-8)
  pkg_check_modules(ICU QUIET IMPORTED_TARGET GLOBAL icu-uc)
endif()

if(PCRE2_FOUND AND NOT NIBBLE_STATIC_UNICODE)
  add_library(nibble::pcre2 ALIAS PkgConfig::PCRE2)
else()
  find_path(NIBBLE_PCRE2_INCLUDE pcre2.h REQUIRED)
  find_library(NIBBLE_PCRE2_LIB NAMES libpcre2-8.a pcre2-8 REQUIRED)
  add_library(nibble::pcre2 UNKNOWN IMPORTED)
  set_target_properties(nibble::pcre2 PROPERTIES IMPORTED_LOCATION ${NIBBLE_PCRE2_LIB}
                        INTERFACE_INCLUDE_DIRECTORIES ${NIBBLE_PCRE2_INCLUDE})
  message(STATUS "nibble: PCRE2 from ${NIBBLE_PCRE2_LIB}")
endif()

if(ICU_FOUND AND NOT NIBBLE_STATIC_UNICODE)
  add_library(nibble::icu ALIAS PkgConfig::ICU)
else()
  find_path(NIBBLE_ICU_INCLUDE unicode/unorm2.h REQUIRED)
  find_library(NIBBLE_ICUUC_LIB NAMES libicuuc.a icuuc REQUIRED)
  find_library(NIBBLE_ICUDATA_LIB NAMES libicudata.a icudata REQUIRED)
  add_library(nibble::icu UNKNOWN IMPORTED)
  set_target_properties(nibble::icu PROPERTIES IMPORTED_LOCATION ${NIBBLE_ICUUC_LIB}
                        INTERFACE_INCLUDE_DIRECTORIES ${NIBBLE_ICU_INCLUDE}
                        INTERFACE_LINK_LIBRARIES "${NIBBLE_ICUDATA_LIB};${CMAKE_DL_LIBS};Threads::Threads")
  message(STATUS "nibble: ICU from ${NIBBLE_ICUUC_LIB}")
endif()
